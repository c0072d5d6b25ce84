package e2e

import (
	"fmt"
	"testing"
	"time"
)

// The nodes/status subresource: the API server keeps label changes made
// through it, so the shipped configuration sends deploy-label changes made
// there to the enforce webhook too, while the matchConditions keep every
// kubelet status update inside the API server.

// TestDeployLabelChangeThroughNodeStatusIsRefused: the bypass of a
// configuration that matched only "nodes": switching the toolkit off under
// the running device plugin of lab-node-0 through the status subresource.
func TestDeployLabelChangeThroughNodeStatusIsRefused(t *testing.T) {
	g := setUpLab(t)
	before := deployLabels(t, "lab-node-0")
	denied := reviews(t, g, "denied", "UPDATE")

	got := kubectl("patch", "node", "lab-node-0", "--subresource=status", "--type=merge",
		"-p", `{"metadata":{"labels":{"nvidia.com/gpu.deploy.container-toolkit":"false"}}}`)
	expectResult(t, "kubectl patch node lab-node-0 --subresource=status container-toolkit=false", got, 1, "",
		forbiddenPrefix+"node lab-node-0: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin "+
			"without the container toolkit (this request sets nvidia.com/gpu.deploy.container-toolkit=\"false\"), so GPU pods "+
			"would be scheduled there and fail to start; keep nvidia.com/gpu.deploy.container-toolkit=true, or turn the device "+
			"plugin off in the same command with nvidia.com/gpu.deploy.device-plugin=false.\n")
	if after := deployLabels(t, "lab-node-0"); after != before {
		t.Errorf("lab-node-0 deploy labels changed by the refused status patch: %q -> %q", before, after)
	}
	if now := reviews(t, g, "denied", "UPDATE"); now != denied+1 {
		t.Errorf("denied UPDATE reviews went from %v to %v, want +1", denied, now)
	}
}

// TestKubeletStatusUpdatesNeverReachTheWebhook: a kubelet's status updates
// (node conditions with fresh heartbeats, as the node's own identity,
// through nodes/status, now matched by the enforce webhook) are filtered
// out by the matchConditions inside the API server: the webhook's review
// counter does not move. The control at the end, a person's deploy-label
// change through the same subresource, moves it by one, so the counter is
// the right one to watch.
func TestKubeletStatusUpdatesNeverReachTheWebhook(t *testing.T) {
	g := setUpLab(t)
	total := reviews(t, g, "", "")
	const heartbeats = 10
	for i := 0; i < heartbeats; i++ {
		now := time.Now().UTC().Format(time.RFC3339)
		for _, node := range labNodeNames {
			patch := fmt.Sprintf(`{"status":{"conditions":[`+
				`{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","message":"kubelet has sufficient memory available","lastHeartbeatTime":%q,"lastTransitionTime":%q},`+
				`{"type":"DiskPressure","status":"False","reason":"KubeletHasNoDiskPressure","message":"kubelet has no disk pressure","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
				now, now, now, now)
			got := kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch,
				"--as=system:node:"+node, "--as-group=system:nodes", "--as-group=system:authenticated")
			if got.code != 0 || got.stdout != "node/"+node+" patched\n" || got.stderr != "" {
				t.Fatalf("kubelet status update of %s: %s", node, got)
			}
		}
	}
	if now := reviews(t, g, "", ""); now != total {
		t.Fatalf("reviews went from %v to %v during %d kubelet status updates, want no change", total, now, heartbeats*len(labNodeNames))
	}
	got := kubectl("patch", "node", "lab-node-1", "--subresource=status", "--type=merge",
		"-p", `{"metadata":{"labels":{"nvidia.com/gpu.deploy.dcgm-exporter":"false"}}}`)
	expectResult(t, "kubectl patch node lab-node-1 --subresource=status dcgm-exporter=false", got, 0, "node/lab-node-1 patched\n", "")
	if now := reviews(t, g, "", ""); now != total+1 {
		t.Errorf("reviews went from %v to %v with one deploy-label change through nodes/status, want +1", total, now)
	}
}
