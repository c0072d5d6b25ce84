package e2e

import (
	"strings"
	"testing"
)

// TestGpusNotAdvertisedAreReported: lab-node-1's device plugin runs (kwok
// plays its pod) while the node's status, written through the status
// subresource as a kubelet would, goes from 8 allocatable GPUs to 0 (the
// plugin reported its devices unhealthy, k8s-device-plugin#1698). The
// watching guard's audit must report gpus-not-advertised on it from the
// status alone, then the plugin that never registered on a node where GPU
// feature discovery counts 4 GPUs, and nothing once 8 GPUs are allocatable
// again.
func TestGpusNotAdvertisedAreReported(t *testing.T) {
	setUpLab(t)
	// Status outlives the lab's node replace: take the GPU resources away
	// again, before the lab is reset for the next test.
	t.Cleanup(func() {
		status(t, `{"status":{"capacity":{"nvidia.com/gpu":null},"allocatable":{"nvidia.com/gpu":null}}}`)
		resetLab(t)
	})
	installWatchedCRDs(t)
	g := startWatchingGuard(t, "--report")

	wait := func(what, line, prefix string) {
		t.Helper()
		waitFinding(t, what, line, "lab-node-1/gpus-not-advertised", prefix)
	}
	status(t, `{"status":{"capacity":{"nvidia.com/gpu":"8"},"allocatable":{"nvidia.com/gpu":"8"}}}`)
	wait("8 GPUs advertised", "lab-node-1 gpus-not-advertised pass medium", "")

	status(t, `{"status":{"allocatable":{"nvidia.com/gpu":"0"}}}`)
	wait("0 of 8 GPUs allocatable", "lab-node-1 gpus-not-advertised warn medium status",
		"node lab-node-1 runs the NVIDIA device plugin (pod nvidia-device-plugin-daemonset-")
	r, err := readPolicyReport()
	if err != nil {
		t.Fatal(err)
	}
	if msg := r.messages["lab-node-1/gpus-not-advertised"]; !strings.Contains(msg, "but its status advertises 0 allocatable NVIDIA GPUs (capacity 8), so the scheduler places no GPU pod there") {
		t.Errorf("the message does not give the numbers:\n%s", msg)
	}
	if n := findingsOf(t, g, "gpus-not-advertised"); n != 1 {
		t.Errorf("audit_findings{rule=gpus-not-advertised} = %v, want 1", n)
	}

	// A plugin that never registered: no GPU resource listed at all, while
	// GPU feature discovery counts 4 GPUs.
	status(t, `{"status":{"capacity":{"nvidia.com/gpu":null},"allocatable":{"nvidia.com/gpu":null}}}`)
	wait("GFD's count back to nothing listed", "lab-node-1 gpus-not-advertised pass medium", "")
	gfd := kubectl("label", "node", "lab-node-1", "nvidia.com/gpu.count=4")
	expectResult(t, "GFD counts 4 GPUs", gfd, 0, "node/lab-node-1 labeled\n", "")
	wait("never registered, GFD counts 4", "lab-node-1 gpus-not-advertised warn medium status",
		"node lab-node-1 runs the NVIDIA device plugin (pod nvidia-device-plugin-daemonset-")
	r, err = readPolicyReport()
	if err != nil {
		t.Fatal(err)
	}
	if msg := r.messages["lab-node-1/gpus-not-advertised"]; !strings.Contains(msg, "GPU feature discovery counts 4 GPU(s) (nvidia.com/gpu.count=4) and its status lists no NVIDIA GPU resource") {
		t.Errorf("the message does not say the plugin never registered:\n%s", msg)
	}

	// The plugin registers its GPUs: nothing to report.
	status(t, `{"status":{"capacity":{"nvidia.com/gpu":"4"},"allocatable":{"nvidia.com/gpu":"4"}}}`)
	wait("4 GPUs advertised", "lab-node-1 gpus-not-advertised pass medium", "")
}

// status patches lab-node-1's status as its kubelet would.
func status(t *testing.T, patch string) {
	t.Helper()
	got := kubectl("patch", "node", "lab-node-1", "--subresource=status", "--type=merge", "-p", patch)
	expectResult(t, "kubectl patch node lab-node-1 --subresource=status "+patch, got, 0, "node/lab-node-1 patched\n", "")
}
