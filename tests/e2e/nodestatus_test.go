package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
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
		"Warning: lab-node-0: gpu-feature-discovery, dcgm-exporter would hang without container-toolkit\n"+forbiddenPrefix+"node lab-node-0: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin "+
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
	// What a kubelet does: a strategic-merge PATCH of its own Node's status
	// with its own client certificate (system:node:<name>, group
	// system:nodes), which the Node authorizer allows. kubectl cannot stand
	// in for it: kubectl patch reads nodes/status first, which the Node
	// authorizer does not grant.
	kubelets := map[string]*kubernetes.Clientset{}
	for _, node := range labNodeNames {
		path, err := cp.WriteUserKubeconfig("system:node:"+node, "system:nodes")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			t.Fatal(err)
		}
		if kubelets[node], err = kubernetes.NewForConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	total := reviews(t, g, "", "")
	const heartbeats = 10
	for i := 0; i < heartbeats; i++ {
		now := time.Now().UTC().Format(time.RFC3339)
		for _, node := range labNodeNames {
			patch := fmt.Sprintf(`{"status":{"conditions":[`+
				`{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","message":"kubelet has sufficient memory available","lastHeartbeatTime":%q,"lastTransitionTime":%q},`+
				`{"type":"DiskPressure","status":"False","reason":"KubeletHasNoDiskPressure","message":"kubelet has no disk pressure","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
				now, now, now, now)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := kubelets[node].CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
			cancel()
			if err != nil {
				t.Fatalf("status update of %s as its kubelet: %v", node, err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := cp.MustKubectl(t, "get", "node", "lab-node-2", "-o", `jsonpath={.status.conditions[?(@.type=="DiskPressure")].reason}`); got != "KubeletHasNoDiskPressure" {
		t.Fatalf("lab-node-2 DiskPressure reason %q after the kubelet's status updates", got)
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
