package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// openReportsCRD is a schema-less stand-in for openreports.io's
// ClusterReport (tests/helm validates the reports against the real CRD).
const openReportsCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusterreports.openreports.io
spec:
  group: openreports.io
  scope: Cluster
  names:
    plural: clusterreports
    singular: clusterreport
    kind: ClusterReport
    listKind: ClusterReportList
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`

// openReportsRBAC is what the chart's ClusterRole grants with
// reportFormat=openreports, for deploy/base's service account.
const openReportsRBAC = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: e2e-gpu-deploy-guard-openreports
rules:
  - apiGroups: ["openreports.io"]
    resources: ["clusterreports"]
    verbs: ["get", "create", "update", "patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-gpu-deploy-guard-openreports
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: e2e-gpu-deploy-guard-openreports
subjects:
  - kind: ServiceAccount
    name: gpu-deploy-guard
    namespace: gpu-deploy-guard
`

// TestServeWritesAnOpenReportsClusterReport: with --report-format
// openreports the continuous audit writes ClusterReport gpu-deploy-guard
// (openreports.io/v1alpha1) by server-side apply, with the same results as
// the ClusterPolicyReport: lab-node-2's device plugin without the toolkit
// fails, and no ClusterPolicyReport is written.
func TestServeWritesAnOpenReportsClusterReport(t *testing.T) {
	setUpIncidentLab(t)
	installWatchedCRDs(t)
	for _, m := range []string{openReportsCRD, openReportsRBAC} {
		manifest := m
		t.Cleanup(func() {
			if got := kubectlWithInput(manifest, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
				t.Errorf("cleanup: %s: %s", firstLineOf(manifest), got)
			}
		})
		if got := kubectlWithInput(manifest, "apply", "-f", "-"); got.code != 0 {
			t.Fatalf("applying %s: %s", firstLineOf(manifest), got)
		}
	}
	cp.WaitCRDsServed(t, "clusterreports.openreports.io")
	kubeconfig := watchingRBAC(t)
	framework.WaitFor(t, watchFollow, "the service account may patch clusterreports", func() (bool, string) {
		got := kubectl("auth", "can-i", "patch", "clusterreports.openreports.io",
			"--as=system:serviceaccount:gpu-deploy-guard:gpu-deploy-guard")
		return got.code == 0, got.String()
	})
	startWatchingReplica(t, kubeconfig, "gpu-deploy-guard-openreports", "--report", "--report-format", "openreports")

	framework.WaitFor(t, watchFollow, "ClusterReport gpu-deploy-guard", func() (bool, string) {
		stdout, stderr, code := cp.Kubectl("get", "clusterreports.openreports.io", "gpu-deploy-guard", "-o", "json", "--show-managed-fields")
		if code != 0 {
			return false, stderr
		}
		var r struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				ManagedFields []struct{ Manager, Operation string } `json:"managedFields"`
			} `json:"metadata"`
			Results []struct {
				Rule, Result, Severity string
				Resources              []struct{ Name string }
			} `json:"results"`
		}
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			return false, err.Error()
		}
		var failed []string
		for _, res := range r.Results {
			if res.Result == "fail" && len(res.Resources) == 1 {
				failed = append(failed, res.Resources[0].Name+" "+res.Rule+" "+res.Severity)
			}
		}
		managers := fmt.Sprint(r.Metadata.ManagedFields)
		got := fmt.Sprintf("%s %s %s %s", r.APIVersion, r.Kind, strings.Join(failed, ","), managers)
		want := "openreports.io/v1alpha1 ClusterReport lab-node-2 device-plugin-without-toolkit high [{gpu-deploy-guard Apply}]"
		return got == want, got
	})
	if _, stderr, code := cp.Kubectl("get", "clusterpolicyreports.wgpolicyk8s.io", "gpu-deploy-guard"); code == 0 || !strings.Contains(stderr, "NotFound") {
		t.Errorf("a ClusterPolicyReport was written too (or could not be read): exit %d %s", code, stderr)
	}
}
