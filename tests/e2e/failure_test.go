package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// TestWebhookOutageFollowsTheShippedFailurePolicy stops the webhook and
// checks what deploy/ promises for that case: people's deploy-label changes
// are refused (enforce webhook, failurePolicy Fail), while the operator's
// changes and node registration go through (observe webhook, Ignore) and
// unrelated label changes never involve the webhook. Then it restarts the
// webhook and checks that refusals come back.
func TestWebhookOutageFollowsTheShippedFailurePolicy(t *testing.T) {
	g := setUpLab(t)
	g.Stop()
	t.Cleanup(func() {
		if !g.Running() {
			if err := g.Start(); err != nil {
				t.Errorf("restarting gpu-deploy-guard: %v", err)
			}
		}
	})
	apiLog := filepath.Join(cp.LogDir, "kube-apiserver.log")
	const failedOpen = "Failed calling webhook, failing open observe.gpu-deploy-guard.io"
	const failedClosed = "Failed calling webhook, failing closed enforce.gpu-deploy-guard.io"
	openBefore, closedBefore := countLines(t, apiLog, failedOpen), countLines(t, apiLog, failedClosed)

	// A person's harmless deploy-label change: refused, because the
	// webhook cannot be asked.
	// The cause is usually "dial tcp ...: connect: connection refused"; an API
	// server that still held a connection to the stopped process may say
	// "connection reset" instead, so only the part that is always there is
	// compared.
	got := kubectl("label", "node", "lab-node-1", deployPrefix+"dcgm-exporter=false", "--overwrite")
	refusal := fmt.Sprintf(`Error from server (InternalError): Internal error occurred: failed calling webhook "enforce.gpu-deploy-guard.io": `+
		`failed to call webhook: Post "https://127.0.0.1:%d/validate?timeout=5s": `, g.Port)
	if got.code != 1 || got.stdout != "" || !strings.HasPrefix(got.stderr, refusal) {
		t.Errorf("webhook down: kubectl label node lab-node-1 dcgm-exporter=false --overwrite:\n%s\nwant exit 1 and stderr starting %q", got, refusal)
	}
	if v := nodeLabels(t, "lab-node-1")[deployPrefix+"dcgm-exporter"]; v != "true" {
		t.Errorf("lab-node-1 dcgm-exporter=%q after the refused change, want \"true\"", v)
	}

	// A label that is not a deploy label: the matchConditions keep the
	// request away from both webhooks, so the outage does not matter.
	got = kubectl("label", "node", "lab-node-1", "example.com/rack=r1")
	expectResult(t, "webhook down: kubectl label node lab-node-1 example.com/rack=r1", got, 0, "node/lab-node-1 labeled\n", "")

	// The operator's deploy-label change: the observe webhook is tried,
	// fails, and the request goes through.
	got = kubectlAsOperator("label", "node", "lab-node-1", deployPrefix+"dcgm-exporter=false", "--overwrite")
	expectResult(t, "webhook down: kubectl label node lab-node-1 dcgm-exporter=false --overwrite --as="+operatorSA, got, 0,
		"node/lab-node-1 labeled\n", "")
	waitDesired(t, "nvidia-dcgm-exporter", "1")

	// Node registration with deploy labels: observe webhook, fails open.
	const node = `apiVersion: v1
kind: Node
metadata:
  name: lab-node-4
  labels:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.deploy.device-plugin: "true"
`
	t.Cleanup(func() { deleteNode(t, "lab-node-4") })
	stdout, stderr, code := cp.KubectlWithInput(node, "create", "-f", "-")
	expectResult(t, "webhook down: kubectl create node lab-node-4 (device-plugin=true)", result{stdout, stderr, code}, 0,
		"node/lab-node-4 created\n", "")

	// The API server's own account of it: exactly one fail-closed call (the
	// person's change) and two fail-open calls (the operator's change and the
	// registration). The rack label change, made in between, called neither.
	framework.WaitFor(t, 10*time.Second, "the API server to log the failed webhook calls", func() (bool, string) {
		open, closed := countLines(t, apiLog, failedOpen)-openBefore, countLines(t, apiLog, failedClosed)-closedBefore
		return open == 2 && closed == 1, fmt.Sprintf("%d fail-open and %d fail-closed calls logged", open, closed)
	})

	if err := g.Start(); err != nil {
		t.Fatalf("restarting gpu-deploy-guard: %v", err)
	}
	useGuard(t) // waits until the API server reaches it again
	expectResult(t, "webhook back: kubectl label node lab-node-2 device-plugin=true",
		kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin=true"), 1, "", labNode2Refusal)
	expectResult(t, "webhook back: kubectl label node lab-node-0 dcgm-exporter=false --overwrite",
		kubectl("label", "node", "lab-node-0", deployPrefix+"dcgm-exporter=false", "--overwrite"), 0, "node/lab-node-0 labeled\n", "")
}

// TestStatusUpdatesAndUnrelatedLabelChangesNeverReachTheWebhook: kubelets
// write node status every few seconds and nodes are relabelled for many
// reasons. None of that may wait on the webhook: nodes/status is not
// matched, and the matchConditions filter out updates that leave the deploy
// labels alone, inside the API server. The webhook's review counter must not
// move; a deploy-label change right after shows that it would.
func TestStatusUpdatesAndUnrelatedLabelChangesNeverReachTheWebhook(t *testing.T) {
	g := setUpLab(t)
	kubelet, err := cp.WriteUserKubeconfig("system:node:lab-node-0", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	before := reviews(t, g, "", "")

	// A heartbeat: the Ready condition a kubelet refreshes every few seconds.
	// (The kubelet itself cannot run this kubectl command: kubectl reads
	// nodes/status first, which the Node authorizer does not grant.)
	now := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
	heartbeat := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady",`+
		`"message":"kubelet is posting ready status","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`, now, now)
	expectResult(t, "kubectl patch node lab-node-0 --subresource=status (heartbeat)",
		kubectl("patch", "node", "lab-node-0", "--subresource=status", "--type=merge", "-p", heartbeat), 0,
		"node/lab-node-0 patched\n", "")
	if got := cp.MustKubectl(t, "get", "node", "lab-node-0", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}`); got != now {
		t.Fatalf("lab-node-0 Ready heartbeat = %q after the status patch, want %q", got, now)
	}
	// A status update of another kind: capacity.
	expectResult(t, "kubectl patch node lab-node-1 --subresource=status (capacity)", kubectl("patch", "node", "lab-node-1",
		"--subresource=status", "--type=merge", "-p", `{"status":{"capacity":{"example.com/widget":"1"}}}`), 0,
		"node/lab-node-1 patched\n", "")
	// Unrelated labels, by a person and by the kubelet.
	expectResult(t, "kubectl label node lab-node-0 topology.kubernetes.io/zone=lab-a",
		kubectl("label", "node", "lab-node-0", "topology.kubernetes.io/zone=lab-a"), 0, "node/lab-node-0 labeled\n", "")
	stdout, stderr, code := cp.KubectlAs(kubelet, "", "label", "node", "lab-node-0", "node.kubernetes.io/instance-type=lab")
	expectResult(t, "kubectl label node lab-node-0 node.kubernetes.io/instance-type=lab (as the node's kubelet)",
		result{stdout, stderr, code}, 0, "node/lab-node-0 labeled\n", "")

	if after := reviews(t, g, "", ""); after != before {
		t.Fatalf("the webhook answered %v reviews during status updates and unrelated label changes, want 0", after-before)
	}

	// The counter does move for a deploy-label change.
	expectResult(t, "kubectl label node lab-node-0 dcgm-exporter=false --overwrite",
		kubectl("label", "node", "lab-node-0", deployPrefix+"dcgm-exporter=false", "--overwrite"), 0, "node/lab-node-0 labeled\n", "")
	if after := reviews(t, g, "", ""); after != before+1 {
		t.Fatalf("reviews went from %v to %v after a deploy-label change, want +1", before, after)
	}
}

// countLines counts the lines of a log file that contain s.
func countLines(t *testing.T, path, s string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), s)
}
