package e2e

import (
	"strings"
	"testing"
)

// janitorRBAC is what NVSentinel's janitor needs of nodes for a GPU reset
// (its labels), as a service account outside the operator's namespace.
const janitorRBAC = `apiVersion: v1
kind: Namespace
metadata:
  name: nvsentinel
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: janitor
  namespace: nvsentinel
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: nvsentinel-janitor-nodes
rules:
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get, list, watch, patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: nvsentinel-janitor-nodes
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: nvsentinel-janitor-nodes
subjects:
  - kind: ServiceAccount
    name: janitor
    namespace: nvsentinel
`

// driverManagerSA writes the pause: k8s-driver-manager runs in the driver
// pod under the driver's service account, in the operator's namespace.
const driverManagerSA = "system:serviceaccount:gpu-operator:nvidia-driver"

// TestNVSentinelJanitorDuringADriverUpgrade runs NVSentinel's GPU reset
// sequence (NVIDIA/NVSentinel#1869) through kubectl as a janitor-like service
// account while k8s-driver-manager has lab-node-0 paused for a driver
// upgrade. The teardown (false) is allowed: nothing runs without the toolkit.
// The restore (true) would start the device plugin while the container
// toolkit is still paused: refused, with a message that says to wait for
// k8s-driver-manager and never to set the paused toolkit label true. When
// k8s-driver-manager writes the labels back the upgrade is over, and the
// retried restore is allowed. Outside an upgrade the whole reset is allowed.
func TestNVSentinelJanitorDuringADriverUpgrade(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() {
		resetLab(t)
		if got := kubectlWithInput(janitorRBAC, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=120s"); got.code != 0 {
			t.Errorf("cleanup: deleting the janitor's RBAC: %s", got)
		}
	})
	if got := kubectlWithInput(janitorRBAC, "apply", "-f", "-"); got.code != 0 {
		t.Fatalf("applying the janitor's RBAC: %s", got)
	}
	janitor := cp.ServiceAccountKubeconfig(t, "nvsentinel-janitor", "nvsentinel", "janitor", []string{"patch", "nodes"})
	grantNodeLabels(t, "e2e-driver-manager-nodes", driverManagerSA)
	asJanitor := func(args ...string) result {
		stdout, stderr, code := cp.KubectlAs(janitor, "", args...)
		return result{stdout, stderr, code}
	}
	reset := []string{"device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery"}
	labels := func(value string) []string {
		args := []string{"label", "node", "lab-node-0", "--overwrite"}
		for _, op := range reset {
			args = append(args, deployPrefix+op+"="+value)
		}
		return args
	}

	// Outside an upgrade: a GPU reset's teardown and restore both go through.
	expectResult(t, "janitor teardown, no upgrade", asJanitor(labels("false")...), 0, "node/lab-node-0 labeled\n", "")
	expectResult(t, "janitor restore, no upgrade", asJanitor(labels("true")...), 0, "node/lab-node-0 labeled\n", "")

	// k8s-driver-manager pauses the node for a driver upgrade.
	pause := []string{"--as=" + driverManagerSA, "label", "node", "lab-node-0", "--overwrite",
		"nvidia.com/gpu-driver-upgrade-state=pod-restart-required"}
	for _, op := range []string{"container-toolkit", "device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery"} {
		pause = append(pause, deployPrefix+op+"=paused-for-driver-upgrade")
	}
	expectResult(t, "k8s-driver-manager pauses lab-node-0", kubectl(pause...), 0, "node/lab-node-0 labeled\n", "")

	// The janitor's teardown overwrites the pause with false: allowed.
	// The guard says k8s-driver-manager will write them back.
	got := asJanitor(labels("false")...)
	if got.code != 0 || got.stdout != "node/lab-node-0 labeled\n" ||
		!strings.Contains(got.stderr, "Warning: lab-node-0: k8s-driver-manager will overwrite 4 label(s) this request writes when the driver upgrade ends") {
		t.Fatalf("janitor teardown during the upgrade: %s", got)
	}
	t.Logf("janitor teardown during the upgrade:\n%s", got)

	// Its restore would run the device plugin while the toolkit is paused.
	got = asJanitor(labels("true")...)
	if got.code != 1 || !strings.Contains(got.stderr, forbiddenPrefix) {
		t.Fatalf("janitor restore during the upgrade: want a refusal, got %s", got)
	}
	for _, says := range []string{
		"nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin without the container toolkit",
		"nvidia.com/gpu.deploy.container-toolkit=\"paused-for-driver-upgrade\" is k8s-driver-manager's pause, " +
			"which it writes back when the driver upgrade ends: wait for that (or finish what paused the node) " +
			"instead of setting nvidia.com/gpu.deploy.container-toolkit=true by hand",
	} {
		if !strings.Contains(got.stderr, says) {
			t.Errorf("the refusal does not say %q:\n%s", says, got.stderr)
		}
	}
	if strings.Contains(got.stderr, "set nvidia.com/gpu.deploy.container-toolkit=true") {
		t.Errorf("the refusal tells the janitor to set the paused toolkit label true:\n%s", got.stderr)
	}
	if v := cp.MustKubectl(t, "get", "node", "lab-node-0", "-o", `jsonpath={.metadata.labels.nvidia\.com/gpu\.deploy\.device-plugin}`); v != "false" {
		t.Fatalf("after the refusal the device plugin label is %q, want false", v)
	}

	// k8s-driver-manager ends the upgrade: it writes back what it read before
	// its pause (true), the janitor's teardown notwithstanding.
	resume := []string{"--as=" + driverManagerSA, "label", "node", "lab-node-0", "--overwrite",
		"nvidia.com/gpu-driver-upgrade-state=upgrade-done"}
	for _, op := range []string{"container-toolkit", "device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery"} {
		resume = append(resume, deployPrefix+op+"=true")
	}
	expectResult(t, "k8s-driver-manager ends the upgrade", kubectl(resume...), 0, "node/lab-node-0 labeled\n", "")
	// The janitor's retried restore now changes nothing and is allowed.
	if got := asJanitor(labels("true")...); got.code != 0 {
		t.Fatalf("janitor restore after the upgrade: %s", got)
	}
}
