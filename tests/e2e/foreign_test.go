package e2e

import (
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// standaloneDevicePlugin is the standalone device-plugin chart's DaemonSet as
// users install it beside the operator (gpu-operator#1704): the plugin's
// image and command, on every node NFD labels with an NVIDIA PCI device.
const standaloneDevicePlugin = `apiVersion: v1
kind: Namespace
metadata:
  name: nvdp
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvdp-nvidia-device-plugin
  namespace: nvdp
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: nvidia-device-plugin
  template:
    metadata:
      labels:
        app.kubernetes.io/name: nvidia-device-plugin
    spec:
      nodeSelector:
        feature.node.kubernetes.io/pci-10de.present: "true"
      tolerations:
      - key: nvidia.com/gpu
        operator: Exists
        effect: NoSchedule
      containers:
      - name: nvidia-device-plugin-ctr
        image: nvcr.io/nvidia/k8s-device-plugin:v0.17.1
        command: ["nvidia-device-plugin"]
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvdp-gpu-feature-discovery
  namespace: nvdp
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: gpu-feature-discovery
  template:
    metadata:
      labels:
        app.kubernetes.io/name: gpu-feature-discovery
    spec:
      nodeSelector:
        feature.node.kubernetes.io/pci-10de.present: "true"
      containers:
      - name: gpu-feature-discovery-ctr
        image: nvcr.io/nvidia/k8s-device-plugin:v0.17.1
        command: ["gpu-feature-discovery"]
`

// TestForeignDevicePluginIsJudgedWhereItRuns: the standalone device-plugin
// chart's DaemonSet in namespace nvdp runs on the lab's NVIDIA nodes beside
// the operator's device plugin. The watching guard (the shipped RBAC: every
// DaemonSet, read for the plugin alone) reports foreign-device-plugin on
// lab-node-0 and lab-node-1, not its GFD DaemonSet of the same image; as the
// webhook it warns when a change turns the operator's plugin and toolkit off
// on lab-node-1, which leaves the foreign plugin there without a toolkit.
func TestForeignDevicePluginIsJudgedWhereItRuns(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() {
		kubectl("delete", "namespace", "nvdp", "--ignore-not-found", "--wait=false")
		resetLab(t)
	})
	installWatchedCRDs(t)
	g := startWatchingGuard(t, "--report")
	register(t, g)
	if got := kubectlWithInput(standaloneDevicePlugin, "apply", "-f", "-"); got.code != 0 {
		t.Fatalf("kubectl apply of the standalone device plugin: %s", got)
	}

	r := waitReportLines(t, "both NVIDIA nodes with two device plugins",
		"lab-node-0 foreign-device-plugin warn high labels", "lab-node-1 foreign-device-plugin warn high labels")
	if strings.Contains(r.text, "lab-node-2 foreign-device-plugin") {
		t.Errorf("lab-node-2 (no NVIDIA PCI label) is judged:\n%s", r.text)
	}
	msg := r.messages["lab-node-1/foreign-device-plugin"]
	if !strings.HasPrefix(msg, "node lab-node-1: the device plugin DaemonSet nvdp/nvdp-nvidia-device-plugin, not the GPU Operator's, already runs there beside the operator's device plugin: two plugins register nvidia.com/gpu") {
		t.Errorf("the finding's message:\n%s", msg)
	}
	if n := findingsOf(t, g, "foreign-device-plugin"); n != 2 {
		t.Errorf("audit_findings{rule=foreign-device-plugin} = %v, want 2", n)
	}

	// The operator's GPU operands and toolkit off on lab-node-1: the foreign
	// plugin stays there, now without a toolkit. Without the foreign
	// DaemonSet this change is harmless; with it, a warning.
	got := kubectl("label", "node", "lab-node-1", deployPrefix+"device-plugin=false", deployPrefix+"container-toolkit=false",
		deployPrefix+"gpu-feature-discovery=false", deployPrefix+"dcgm-exporter=false", "--overwrite")
	expectResult(t, "the operator's plugin and toolkit off beside a foreign plugin", got, 0, "node/lab-node-1 labeled\n",
		"Warning: lab-node-1: device plugin nvdp/nvdp-nvidia-device-plugin runs without the container toolkit\n")
	framework.WaitFor(t, watchFollow, "the foreign plugin without a toolkit", func() (bool, string) {
		r, err := readPolicyReport()
		if err != nil {
			return false, err.Error()
		}
		msg := r.messages["lab-node-1/foreign-device-plugin"]
		return strings.Contains(r.text, "lab-node-1 foreign-device-plugin warn high labels") &&
			strings.Contains(msg, "runs there without the operator's container toolkit, so GPU pods scheduled there fail to start"), msg
	})

	// The standalone plugin goes: nothing to report.
	expectResult(t, "kubectl delete daemonset", kubectl("-n", "nvdp", "delete", "daemonset", "nvdp-nvidia-device-plugin"), 0,
		"daemonset.apps \"nvdp-nvidia-device-plugin\" deleted\n", "")
	waitReportLines(t, "the findings gone with the DaemonSet",
		"lab-node-0 foreign-device-plugin pass high", "lab-node-1 foreign-device-plugin pass high")
}
