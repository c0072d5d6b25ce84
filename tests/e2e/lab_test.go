package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"gpu-deploy-guard/tests/e2e/framework"
)

// Shared by the tests that need the webhook: one `gpu-deploy-guard serve`
// for the whole package, started by the first of them, stopped with the
// control plane.
var guard *framework.Guard

const (
	operatorRBAC = "testdata/gpu-operator-rbac.yaml"
	// The GPU Operator's own service account, as the real operator calls the API.
	operatorSA = "system:serviceaccount:gpu-operator:gpu-operator"

	deployPrefix = "nvidia.com/gpu.deploy."
	reviewsTotal = "gpu_deploy_guard_admission_reviews_total"
)

// labDaemonSets maps the operand names `gpu-deploy-guard check` prints to
// the lab's DaemonSets (testdata/gpu-operator-daemonsets.yaml).
var labDaemonSets = map[string]string{
	"driver":                "nvidia-driver-daemonset",
	"container-toolkit":     "nvidia-container-toolkit-daemonset",
	"device-plugin":         "nvidia-device-plugin-daemonset",
	"gpu-feature-discovery": "gpu-feature-discovery",
	"dcgm-exporter":         "nvidia-dcgm-exporter",
}

var labNodeNames = []string{"lab-node-0", "lab-node-1", "lab-node-2"}

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// useGuard returns the shared webhook, starting it on first use with the
// policy from deploy/base's ConfigMap, and (re)registers deploy/base's
// ValidatingWebhookConfiguration pointed at it. Registration is repeated on
// every call because the deploy/ tests replace that configuration with the
// shipped one (a Service reference) and delete it again.
func useGuard(t testing.TB) *framework.Guard {
	t.Helper()
	root := repoRoot(t)
	if guard == nil {
		bin := framework.RequireProductBinary(t)
		dir := filepath.Join(cp.Dir, "gpu-deploy-guard")
		configFile, err := cp.WriteShippedGuardConfig(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		g, err := framework.StartGuard(framework.GuardConfig{Bin: bin, Dir: dir, LogDir: cp.LogDir, ConfigFile: configFile})
		if g != nil {
			cp.AddCleanup(g.Stop)
		}
		if err != nil {
			t.Fatalf("starting gpu-deploy-guard serve: %v", err)
		}
		guard = g
	}
	if !guard.Running() {
		t.Fatalf("the shared gpu-deploy-guard is not running (a test stopped it and could not restart it); see %s", guard.LogPath())
	}
	if err := cp.RegisterGuard(root, guard); err != nil {
		t.Fatal(err)
	}
	return guard
}

// setUpLab registers the webhook and resets the lab: the five operand
// DaemonSets, the operator's service account with its RBAC, and the three
// lab nodes with exactly the labels of testdata/lab-nodes.yaml. It waits
// until the DaemonSet controller has caught up with those labels.
//
// Nodes that exist are replaced rather than deleted: kube-scheduler has
// bound DaemonSet pods to them, and without the pod GC controller those
// pods would outlive a deleted node (kwok, which finishes pod deletions,
// only serves nodes that exist).
func setUpLab(t *testing.T) *framework.Guard {
	t.Helper()
	g := useGuard(t)
	resetLab(t)
	return g
}

// resetLab is setUpLab without registering the shared webhook, for tests
// that register their own (the Helm chart's). It runs one kubectl per step
// (every lab test begins here): one apply of both files, one look at which
// nodes exist, one replace of those and one create of the others, one poll
// of the five DaemonSets.
func resetLab(t *testing.T) {
	t.Helper()
	applyLabObjects(t)
	data, err := os.ReadFile(labNodes)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := framework.SplitManifests(data)
	if err != nil {
		t.Fatal(err)
	}
	existing := strings.Fields(cp.MustKubectl(t, "get", "nodes", "-o", "name"))
	var replace, create []string
	for _, n := range nodes {
		if slices.Contains(existing, "node/"+n.Name) {
			replace = append(replace, string(n.YAML))
		} else {
			create = append(create, string(n.YAML))
		}
	}
	for _, step := range []struct {
		verb  string
		nodes []string
	}{{"replace", replace}, {"create", create}} {
		if len(step.nodes) == 0 {
			continue
		}
		if stdout, stderr, code := cp.KubectlWithInput(strings.Join(step.nodes, "\n---\n"), step.verb, "-f", "-"); code != 0 {
			t.Fatalf("kubectl %s of the lab nodes: exit %d\nstdout: %s\nstderr: %s", step.verb, code, stdout, stderr)
		}
	}
	waitAllDesired(t, map[string]string{
		"nvidia-driver-daemonset":            "1",
		"nvidia-container-toolkit-daemonset": "2",
		"nvidia-device-plugin-daemonset":     "2",
		"gpu-feature-discovery":              "2",
		"nvidia-dcgm-exporter":               "2",
	})
}

// labApplied is labObjects() as the last apply of the lab's DaemonSets and
// RBAC left them.
var labApplied string

// applyLabObjects applies the operand DaemonSets and the operator's RBAC,
// unless every one of them is as the last apply left it: the same object
// (uid), spec (generation; resourceVersion for kinds without one), labels
// and annotations (among them the applied configuration). An apply would
// change nothing then, and it is the dearest kubectl call of resetLab.
func applyLabObjects(t *testing.T) {
	t.Helper()
	if labApplied != "" && labObjects() == labApplied {
		return
	}
	cp.MustKubectl(t, "apply", "-f", operandDaemonSet, "-f", operatorRBAC)
	labApplied = labObjects()
}

// labObjects describes the objects of operandDaemonSet and operatorRBAC as
// stored, one line each, or is "" when one of them cannot be read.
func labObjects() string {
	stdout, _, code := cp.Kubectl("get", "-f", operandDaemonSet, "-f", operatorRBAC, "-o", "json")
	if code != 0 {
		return ""
	}
	var list struct {
		Items []struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Namespace       string            `json:"namespace"`
				Name            string            `json:"name"`
				UID             string            `json:"uid"`
				Generation      int64             `json:"generation"`
				ResourceVersion string            `json:"resourceVersion"`
				Labels          map[string]string `json:"labels"`
				Annotations     map[string]string `json:"annotations"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(stdout), &list); err != nil || len(list.Items) == 0 {
		return ""
	}
	var lines []string
	for _, o := range list.Items {
		m := o.Metadata
		version := fmt.Sprintf("generation %d", m.Generation)
		if m.Generation == 0 {
			version = "resourceVersion " + m.ResourceVersion
		}
		lines = append(lines, fmt.Sprintf("%s %s/%s uid %s %s labels %v annotations %v",
			o.Kind, m.Namespace, m.Name, m.UID, version, m.Labels, m.Annotations))
	}
	return strings.Join(lines, "\n")
}

// result is what one kubectl invocation did.
type result struct {
	stdout, stderr string
	code           int
}

func kubectl(args ...string) result {
	stdout, stderr, code := cp.Kubectl(args...)
	return result{stdout, stderr, code}
}

// kubectlAsOperator runs kubectl impersonating the GPU Operator's service
// account (the admin may impersonate; RBAC then judges the service account).
func kubectlAsOperator(args ...string) result {
	return kubectl(append([]string{"--as=" + operatorSA}, args...)...)
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout ---\n%s--- stderr ---\n%s", r.code, r.stdout, r.stderr)
}

// expectResult fails the test unless kubectl exited with code and printed
// exactly stdout and stderr.
func expectResult(t *testing.T, what string, got result, code int, stdout, stderr string) {
	t.Helper()
	want := result{stdout, stderr, code}
	if got != want {
		t.Fatalf("%s:\ngot  %s\nwant %s", what, got, want)
	}
	t.Logf("%s:\n%s", what, got)
}

// nodeLabels returns the node's current labels.
func nodeLabels(t *testing.T, node string) map[string]string {
	t.Helper()
	var n struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "node", node, "-o", "json")), &n); err != nil {
		t.Fatal(err)
	}
	return n.Metadata.Labels
}

// deployLabels is the node's nvidia.com/gpu.deploy.* labels as sorted
// key=value text, for comparing before and after a refused request.
func deployLabels(t *testing.T, node string) string {
	t.Helper()
	var out []string
	for k, v := range nodeLabels(t, node) {
		if strings.HasPrefix(k, deployPrefix) {
			out = append(out, k+"="+v)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// reviews reads the webhook's review counter for one decision and
// operation ("" matches any).
func reviews(t *testing.T, g *framework.Guard, decision, operation string) float64 {
	t.Helper()
	match := map[string]string{}
	if decision != "" {
		match["decision"] = decision
	}
	if operation != "" {
		match["operation"] = operation
	}
	v, err := g.Counter(reviewsTotal, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRegisteredWebhooksAreDeployBaseExceptClientConfig: everything the lab
// tests prove about matching, failure policies and timeouts holds for the
// shipped configuration only if what is registered is that configuration.
// Compare what the API server stored with `kubectl kustomize deploy/base`,
// webhook by webhook, with only clientConfig set aside.
func TestRegisteredWebhooksAreDeployBaseExceptClientConfig(t *testing.T) {
	g := useGuard(t)
	shipped, err := cp.ShippedWebhookConfiguration(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	var stored admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.Unmarshal([]byte(cp.MustKubectl(t, "get", "validatingwebhookconfiguration",
		framework.WebhookConfigurationName, "-o", "yaml")), &stored); err != nil {
		t.Fatal(err)
	}
	if len(stored.Webhooks) != len(shipped.Webhooks) || len(shipped.Webhooks) != 3 {
		t.Fatalf("stored %d webhooks, deploy/base ships %d; want the three of deploy/base", len(stored.Webhooks), len(shipped.Webhooks))
	}
	for i := range shipped.Webhooks {
		want, got := shipped.Webhooks[i].DeepCopy(), stored.Webhooks[i].DeepCopy()
		// /validate, or below it (/validate/gpu-policy for the policy webhook).
		url := g.URL() + strings.TrimPrefix(*want.ClientConfig.Service.Path, "/validate")
		if got.ClientConfig.URL == nil || *got.ClientConfig.URL != url || got.ClientConfig.Service != nil {
			t.Errorf("webhook %s: clientConfig %+v, want url %s only", got.Name, got.ClientConfig, url)
		}
		want.ClientConfig, got.ClientConfig = admissionregistrationv1.WebhookClientConfig{}, admissionregistrationv1.WebhookClientConfig{}
		// The API server's defaults for what deploy/base leaves out: match
		// every namespace and object.
		if want.NamespaceSelector == nil {
			want.NamespaceSelector = &metav1.LabelSelector{}
		}
		if want.ObjectSelector == nil {
			want.ObjectSelector = &metav1.LabelSelector{}
		}
		if !reflect.DeepEqual(want, got) {
			w, _ := yaml.Marshal(want)
			g, _ := yaml.Marshal(got)
			t.Errorf("webhook %d differs from deploy/base beyond clientConfig:\nregistered:\n%s\ndeploy/base:\n%s", i, g, w)
		}
	}
}

// grantNodeLabels gives each service account ("system:serviceaccount:<ns>:
// <name>") what its component needs to label nodes (get and patch), as
// their charts do, until the test ends; the suite impersonates them.
func grantNodeLabels(t *testing.T, name string, users ...string) {
	t.Helper()
	var subjects strings.Builder
	for _, u := range users {
		parts := strings.Split(u, ":")
		if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" {
			t.Fatalf("grantNodeLabels: %q is no service account user name", u)
		}
		fmt.Fprintf(&subjects, "  - kind: ServiceAccount\n    name: %s\n    namespace: %s\n", parts[3], parts[2])
	}
	manifest := fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: %[1]s
rules:
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get, list, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: %[1]s
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: %[1]s
subjects:
%[2]s`, name, subjects.String())
	t.Cleanup(func() {
		if got := kubectlWithInput(manifest, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: deleting %s: %s", name, got)
		}
	})
	if got := kubectlWithInput(manifest, "apply", "-f", "-"); got.code != 0 {
		t.Fatalf("applying %s: %s", name, got)
	}
	for _, u := range users {
		framework.WaitFor(t, watchFollow, u+" may patch nodes", func() (bool, string) {
			got := kubectl("auth", "can-i", "patch", "nodes", "--as="+u)
			return got.code == 0, got.String()
		})
	}
}
