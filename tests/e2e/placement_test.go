package e2e

import (
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The warnings of `kubectl taint node lab-node-0 nvidia.com/gpu-xid-error=79:NoSchedule`
// against the operator's own tolerations (nvidia.com/gpu only).
const xidTaintWarnings = "Warning: lab-node-0: container-toolkit would never be re-created under taint " +
	"nvidia.com/gpu-xid-error=79:NoSchedule while device-plugin runs\n" +
	"Warning: lab-node-0: driver, device-plugin, gpu-feature-discovery, dcgm-exporter would never be " +
	"re-created under taint nvidia.com/gpu-xid-error=79:NoSchedule\n"

// TestATaintTheOperandsDoNotTolerateIsWarned: NVSentinel-style quarantine
// (`nvidia.com/gpu-xid-error:NoSchedule`) on a node that runs operands
// reaches the webhook through its matchConditions. It breaks nothing at once
// (the DaemonSet controller keeps running pods), so it is allowed, with a
// warning for what could never be re-created, the toolkit first. A taint the
// node lifecycle controller owns (node.kubernetes.io/*) never reaches the
// webhook, and removing the taint is allowed without a word.
func TestATaintTheOperandsDoNotTolerateIsWarned(t *testing.T) {
	g := setUpLab(t)
	t.Cleanup(func() { resetLab(t) })
	if predicted := predict(t, "lab-node-0"); !predicted.Allowed || len(predicted.Warnings) != 0 {
		t.Fatalf("check on the untainted lab-node-0: %+v", predicted)
	}
	allowed := reviews(t, g, "allowed", "UPDATE")

	got := kubectl("taint", "node", "lab-node-0", "nvidia.com/gpu-xid-error=79:NoSchedule")
	expectResult(t, "kubectl taint node lab-node-0 nvidia.com/gpu-xid-error=79:NoSchedule", got, 0,
		"node/lab-node-0 tainted\n", xidTaintWarnings)
	if now := reviews(t, g, "allowed", "UPDATE"); now != allowed+1 {
		t.Errorf("allowed UPDATE reviews went from %v to %v, want +1", allowed, now)
	}
	// check, on the node as it is now (its taints read from the Node), says the same.
	tainted := predict(t, "lab-node-0")
	want := strings.TrimPrefix(strings.TrimSuffix(xidTaintWarnings, "\n"), "Warning: ")
	if strings.Join(tainted.Warnings, "\nWarning: ") != want {
		t.Errorf("check on the tainted lab-node-0 warns %q, want %q", tainted.Warnings, want)
	}

	// A condition taint is the node lifecycle controller's: no review.
	seen := reviews(t, g, "", "UPDATE")
	got = kubectl("taint", "node", "lab-node-0", "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
	expectResult(t, "kubectl taint node lab-node-0 node.kubernetes.io/out-of-service=...", got, 0,
		"node/lab-node-0 tainted\n", "")
	if now := reviews(t, g, "", "UPDATE"); now != seen {
		t.Errorf("a node.kubernetes.io/ taint reached the webhook: UPDATE reviews %v -> %v", seen, now)
	}

	got = kubectl("taint", "node", "lab-node-0", "nvidia.com/gpu-xid-error-")
	expectResult(t, "kubectl taint node lab-node-0 nvidia.com/gpu-xid-error-", got, 0,
		"node/lab-node-0 untainted\n", "")
}

// TestANoExecuteTaintThatEvictsOnlyTheToolkitIsRefused: tolerations can differ
// per DaemonSet. With a device plugin DaemonSet that tolerates every taint
// (as some clusters give it), a NoExecute taint evicts the container toolkit
// but not the device plugin: the device-plugin-without-toolkit refusal,
// although no label changed. The watching webhook reads the DaemonSets'
// tolerations from the cluster.
func TestANoExecuteTaintThatEvictsOnlyTheToolkitIsRefused(t *testing.T) {
	setUpLab(t)
	installWatchedCRDs(t)
	registerWatchingGuard(t)
	plugin := "nvidia-device-plugin-daemonset"
	cp.MustKubectl(t, "patch", "daemonset", "-n", operatorNS, plugin, "--type=json",
		"-p", `[{"op":"add","path":"/spec/template/spec/tolerations","value":[{"operator":"Exists"}]}]`)
	t.Cleanup(func() {
		// kubectl apply keeps a field its last applied configuration never had: remove it.
		if _, stderr, code := cp.Kubectl("patch", "daemonset", "-n", operatorNS, plugin, "--type=json",
			"-p", `[{"op":"remove","path":"/spec/template/spec/tolerations"}]`); code != 0 {
			t.Errorf("cleanup: removing the device plugin's tolerations: %s", stderr)
		}
		resetLab(t)
	})

	taint := []string{"taint", "node", "lab-node-0", "example.com/maintenance=now:NoExecute"}
	refusal := forbiddenPrefix + "node lab-node-0: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA " +
		"device plugin without the container toolkit (nvidia.com/gpu.deploy.container-toolkit is \"true\", but its " +
		"DaemonSet does not tolerate the node's taint example.com/maintenance=now:NoExecute, which evicts its pod), " +
		"so GPU pods would be scheduled there and fail to start; do not taint the node with " +
		"example.com/maintenance=now:NoExecute, or tolerate it in the container toolkit's DaemonSet too (the " +
		"ClusterPolicy's spec.daemonsets.tolerations).\n"
	// The watch learns the patched tolerations within its debounce.
	framework.WaitFor(t, watchFollow, "the webhook refuses the NoExecute taint", func() (bool, string) {
		got := kubectl(append(taint, "--dry-run=server")...)
		return got.code == 1 && strings.HasSuffix(got.stderr, refusal), got.String()
	})
	got := kubectl(taint...)
	if got.code != 1 || !strings.HasSuffix(got.stderr, refusal) {
		t.Errorf("kubectl %s: want the refusal\n%s\ngot %s", strings.Join(taint, " "), refusal, got)
	}
	if out := cp.MustKubectl(t, "get", "node", "lab-node-0", "-o", "jsonpath={.spec.taints}"); out != "" {
		t.Errorf("lab-node-0 taints after the refusal: %s", out)
	}
}

// toolkitRollout is the refusal of a ClusterPolicy change that rolls the
// toolkit while lab-node-0 carries a NoSchedule taint it does not tolerate.
const toolkitRollout = "ClusterPolicy cluster-policy: this change rolls the container toolkit DaemonSet " +
	"(spec.toolkit.version: unset -> \"v1.17.5\"); on 1 node (lab-node-0) a NoSchedule taint the toolkit does not " +
	"tolerate (example.com/maintenance=now:NoSchedule) keeps the new pod off, so the old one exits, removing the " +
	"nvidia runtime, while the device plugin keeps advertising GPUs and GPU pods scheduled there cannot start. " +
	"Remove or tolerate the taint (spec.daemonsets.tolerations) before the change, or drain those nodes; if the " +
	"hosts bring their own toolkit, set " + hostToolkitKey + "."

// TestAToolkitRolloutOnATaintedNodeIsRefused: no label changes, yet a new
// toolkit version in the ClusterPolicy rolls the toolkit DaemonSet, whose
// controller deletes the toolkit pod of lab-node-0 and, under a NoSchedule
// taint the toolkit does not tolerate, never creates the new one, while the
// device plugin there stays. The watching guard reads the taint from its node
// records (whole Nodes watched) and refuses, naming the node and the taint;
// the same change tolerating the taint passes, and so does a change that
// does not reach the toolkit's template.
func TestAToolkitRolloutOnATaintedNodeIsRefused(t *testing.T) {
	setUpPolicyLab(t)
	createClusterPolicy(t)
	taint := "example.com/maintenance=now:NoSchedule"
	if got := kubectl("taint", "node", "lab-node-0", taint); got.code != 0 {
		t.Fatalf("kubectl taint node lab-node-0 %s: %s", taint, got)
	}
	t.Cleanup(func() {
		if got := kubectl("taint", "node", "lab-node-0", "example.com/maintenance-"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	upgrade := `{"spec":{"toolkit":{"version":"v1.17.5"}}}`
	refused := result{"", policyForbidden + toolkitRollout + "\n", 1}
	framework.WaitFor(t, watchFollow, "the guard to read lab-node-0's taint", func() (bool, string) {
		got := kubectl("patch", "clusterpolicy", clusterPolicyName, "--type=merge", "-p", upgrade, "--dry-run=server")
		return got == refused, got.String()
	})
	expectResult(t, "kubectl patch clusterpolicy toolkit.version", kubectl("patch", "clusterpolicy",
		clusterPolicyName, "--type=merge", "-p", upgrade), refused.code, refused.stdout, refused.stderr)
	if v := cp.MustKubectl(t, "get", "clusterpolicy", clusterPolicyName, "-o", "jsonpath={.spec.toolkit.version}"); v != "" {
		t.Errorf("spec.toolkit.version stored after the refusal: %q", v)
	}
	tolerated := `{"spec":{"toolkit":{"version":"v1.17.5"},"daemonsets":{"tolerations":[` +
		`{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"},{"key":"example.com/maintenance","operator":"Exists"}]}}}`
	expectResult(t, "the same change tolerating the taint", kubectl("patch", "clusterpolicy", clusterPolicyName,
		"--type=merge", "-p", tolerated, "--dry-run=server"), 0, "clusterpolicy.nvidia.com/cluster-policy patched\n", "")
	expectResult(t, "a change of the device plugin's version", kubectl("patch", "clusterpolicy", clusterPolicyName,
		"--type=merge", "-p", `{"spec":{"devicePlugin":{"version":"v0.17.1"}}}`, "--dry-run=server"),
		0, "clusterpolicy.nvidia.com/cluster-policy patched\n", "")
}
