package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// What kubectl prints when the enforce webhook refuses a request.
const forbiddenPrefix = `Error from server (Forbidden): admission webhook "enforce.gpu-deploy-guard.io" denied the request: `

// The refusal of `kubectl label node lab-node-2 nvidia.com/gpu.deploy.device-plugin=true`.
const labNode2Refusal = "Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n" +
	forbiddenPrefix + "node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin " +
	"without the container toolkit (nvidia.com/gpu.deploy.container-toolkit is not set), so GPU pods would be " +
	"scheduled there and fail to start; set nvidia.com/gpu.deploy.container-toolkit=true in the same command, " +
	"or leave the device plugin off (nvidia.com/gpu.deploy.device-plugin=false).\n"

// TestDevicePluginWithoutToolkitIsRefusedByKubectl is the lab's incident:
// labelling the GPU-less lab-node-2 with only device-plugin=true. The API
// server must refuse it through the enforce webhook, kubectl must show the
// webhook's whole explanation, and the node must keep its labels.
func TestDevicePluginWithoutToolkitIsRefusedByKubectl(t *testing.T) {
	g := setUpLab(t)
	change := []string{deployPrefix + "device-plugin=true"}
	predicted := predict(t, "lab-node-2", change...)
	denied := reviews(t, g, "denied", "UPDATE")

	got := kubectl(append([]string{"label", "node", "lab-node-2"}, change...)...)
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true", got, 1, "", labNode2Refusal)
	expectAgreesWithCheck(t, predicted, got)
	if labels := deployLabels(t, "lab-node-2"); labels != "" {
		t.Errorf("lab-node-2 deploy labels after the refusal: %q, want none", labels)
	}
	if now := reviews(t, g, "denied", "UPDATE"); now != denied+1 {
		t.Errorf("denied UPDATE reviews went from %v to %v, want +1", denied, now)
	}
	waitDesired(t, "nvidia-device-plugin-daemonset", "2")
}

// TestServerSideDryRunGetsTheSameRefusal: `--dry-run=server` goes through
// admission (the webhooks declare sideEffects None), so a user can ask
// whether a change would pass and get the identical answer, with nothing
// changed.
func TestServerSideDryRunGetsTheSameRefusal(t *testing.T) {
	g := setUpLab(t)
	denied := reviews(t, g, "denied", "UPDATE")

	got := kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin=true", "--dry-run=server")
	expectResult(t, "kubectl label --dry-run=server node lab-node-2 device-plugin=true", got, 1, "", labNode2Refusal)
	if labels := deployLabels(t, "lab-node-2"); labels != "" {
		t.Errorf("lab-node-2 deploy labels after the dry run: %q, want none", labels)
	}
	if now := reviews(t, g, "denied", "UPDATE"); now != denied+1 {
		t.Errorf("denied UPDATE reviews went from %v to %v, want +1", denied, now)
	}

	// A dry run that would pass says so, and changes nothing either.
	got = kubectl("label", "node", "lab-node-1", deployPrefix+"dcgm-exporter=false", "--overwrite", "--dry-run=server")
	expectResult(t, "kubectl label --dry-run=server node lab-node-1 dcgm-exporter=false", got, 0,
		"node/lab-node-1 labeled (server dry run)\n", "")
	if v := nodeLabels(t, "lab-node-1")[deployPrefix+"dcgm-exporter"]; v != "true" {
		t.Errorf("lab-node-1 dcgm-exporter=%q after a dry run, want the unchanged \"true\"", v)
	}
}

// TestTurningOffAnOperandNothingDependsOnIsAllowed: switching off the DCGM
// exporter on lab-node-1 breaks nothing, so it passes without a word and
// the DaemonSet controller follows (the lab's BEFORE=2 AFTER=1).
func TestTurningOffAnOperandNothingDependsOnIsAllowed(t *testing.T) {
	g := setUpLab(t)
	change := []string{deployPrefix + "dcgm-exporter=false", "--overwrite"}
	predicted := predict(t, "lab-node-1", change[0])
	allowed := reviews(t, g, "allowed", "UPDATE")

	got := kubectl(append([]string{"label", "node", "lab-node-1"}, change...)...)
	expectResult(t, "kubectl label node lab-node-1 dcgm-exporter=false --overwrite", got, 0, "node/lab-node-1 labeled\n", "")
	expectAgreesWithCheck(t, predicted, got)
	if now := reviews(t, g, "allowed", "UPDATE"); now != allowed+1 {
		t.Errorf("allowed UPDATE reviews went from %v to %v, want +1", allowed, now)
	}
	waitDesired(t, "nvidia-dcgm-exporter", "1")
	waitPodNodes(t, "nvidia-dcgm-exporter", []string{"lab-node-0"})
}

// TestRemovingTheToolkitUnderARunningDevicePluginIsRefused: the other way
// into the bad state. The message names what the request does (removes the
// toolkit label) and the two ways out; the warnings name what else would
// break.
func TestRemovingTheToolkitUnderARunningDevicePluginIsRefused(t *testing.T) {
	setUpLab(t)
	change := deployPrefix + "container-toolkit-"
	predicted := predict(t, "lab-node-0", change)
	before := deployLabels(t, "lab-node-0")

	got := kubectl("label", "node", "lab-node-0", change)
	expectResult(t, "kubectl label node lab-node-0 container-toolkit-", got, 1, "",
		"Warning: lab-node-0: gpu-feature-discovery, dcgm-exporter would hang without container-toolkit\n"+
			"Warning: nvidia.com/gpu.deploy.container-toolkit removed: the GPU Operator will add it back as true; keep it off only with device-plugin=false too\n"+
			forbiddenPrefix+"node lab-node-0: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin "+
			"without the container toolkit (this request removes nvidia.com/gpu.deploy.container-toolkit), so GPU pods "+
			"would be scheduled there and fail to start; keep nvidia.com/gpu.deploy.container-toolkit=true, or turn the "+
			"device plugin off in the same command with nvidia.com/gpu.deploy.device-plugin=false.\n")
	expectAgreesWithCheck(t, predicted, got)
	if after := deployLabels(t, "lab-node-0"); after != before {
		t.Errorf("lab-node-0 deploy labels changed despite the refusal:\nbefore %s\nafter  %s", before, after)
	}

	// Setting it to false instead of removing it is refused just the same.
	got = kubectl("label", "node", "lab-node-1", deployPrefix+"container-toolkit=false", "--overwrite")
	expectResult(t, "kubectl label node lab-node-1 container-toolkit=false --overwrite", got, 1, "",
		"Warning: lab-node-1: gpu-feature-discovery, dcgm-exporter would hang without container-toolkit\n"+
			forbiddenPrefix+"node lab-node-1: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin "+
			"without the container toolkit (this request sets nvidia.com/gpu.deploy.container-toolkit=\"false\"), so GPU "+
			"pods would be scheduled there and fail to start; keep nvidia.com/gpu.deploy.container-toolkit=true, or turn "+
			"the device plugin off in the same command with nvidia.com/gpu.deploy.device-plugin=false.\n")
	if v := nodeLabels(t, "lab-node-1")[deployPrefix+"container-toolkit"]; v != "true" {
		t.Errorf("lab-node-1 container-toolkit=%q after the refusal, want the unchanged \"true\"", v)
	}
}

// TestSwitchingDevicePluginAndToolkitOffTogetherIsAllowed: the way out the
// refusal suggests. Turning both off in one command is allowed; the
// operands still waiting for the toolkit are reported as a warning, and
// the DaemonSet controller drops both operands from the node.
func TestSwitchingDevicePluginAndToolkitOffTogetherIsAllowed(t *testing.T) {
	setUpLab(t)
	change := []string{deployPrefix + "device-plugin=false", deployPrefix + "container-toolkit=false"}
	predicted := predict(t, "lab-node-0", change...)

	got := kubectl(append(append([]string{"label", "node", "lab-node-0"}, change...), "--overwrite")...)
	expectResult(t, "kubectl label node lab-node-0 device-plugin=false container-toolkit=false --overwrite", got, 0,
		"node/lab-node-0 labeled\n",
		"Warning: lab-node-0: gpu-feature-discovery, dcgm-exporter would hang without container-toolkit\n")
	expectAgreesWithCheck(t, predicted, got)
	labels := nodeLabels(t, "lab-node-0")
	if labels[deployPrefix+"device-plugin"] != "false" || labels[deployPrefix+"container-toolkit"] != "false" {
		t.Errorf("lab-node-0 labels after the change: %v", labels)
	}
	waitDesired(t, "nvidia-device-plugin-daemonset", "1")
	waitDesired(t, "nvidia-container-toolkit-daemonset", "1")
	waitPodNodes(t, "nvidia-device-plugin-daemonset", []string{"lab-node-1"})
}

// TestWarningsArePrintedAsKubectlWarningLines: an allowed request with
// findings configured as warn gets each of them on its own `Warning:` line
// on stderr, and still succeeds.
func TestWarningsArePrintedAsKubectlWarningLines(t *testing.T) {
	setUpLab(t)
	change := []string{
		deployPrefix + "container-toolkit=true",
		deployPrefix + "device-plugin=true",
		deployPrefix + "dcgm-exporters=true", // a typo
	}
	predicted := predict(t, "lab-node-2", change...)

	got := kubectl(append([]string{"label", "node", "lab-node-2"}, change...)...)
	expectResult(t, "kubectl label node lab-node-2 container-toolkit=true device-plugin=true dcgm-exporters=true", got, 0,
		"node/lab-node-2 labeled\n",
		"Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n"+
			"Warning: nvidia.com/gpu.deploy.dcgm-exporters is not a known deploy label; did you mean dcgm-exporter?\n")
	expectAgreesWithCheck(t, predicted, got)
	waitDesired(t, "nvidia-device-plugin-daemonset", "3")
}

// TestOperatorServiceAccountIsNeverRefused: the GPU Operator labels nodes
// itself and must never be blocked. Acting as its service account (with the
// RBAC the real operator has), the same change that is refused to a person
// goes through, silently, through the fail-open observe webhook, and the
// webhook records it as an exempt decision (the audit-annotation path).
func TestOperatorServiceAccountIsNeverRefused(t *testing.T) {
	g := setUpLab(t)
	// RBAC first: a refusal by RBAC would say nothing about admission.
	expectResult(t, "kubectl auth can-i patch nodes -A --as="+operatorSA,
		kubectlAsOperator("auth", "can-i", "patch", "nodes", "-A"), 0, "yes\n", "")

	exempt := reviews(t, g, "exempt", "UPDATE")
	denied := reviews(t, g, "denied", "UPDATE")
	got := kubectlAsOperator("label", "node", "lab-node-2", deployPrefix+"device-plugin=true")
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --as="+operatorSA, got, 0, "node/lab-node-2 labeled\n", "")
	if v := nodeLabels(t, "lab-node-2")[deployPrefix+"device-plugin"]; v != "true" {
		t.Errorf("lab-node-2 device-plugin=%q after the operator's change, want \"true\"", v)
	}
	if now := reviews(t, g, "exempt", "UPDATE"); now != exempt+1 {
		t.Errorf("exempt UPDATE reviews went from %v to %v, want +1: the observe webhook did not see the operator's change", exempt, now)
	}
	if now := reviews(t, g, "denied", "UPDATE"); now != denied {
		t.Errorf("denied UPDATE reviews went from %v to %v", denied, now)
	}
	// What the operator did, the DaemonSet controller acts on.
	waitDesired(t, "nvidia-device-plugin-daemonset", "3")
}

// TestNodeRegistrationWithABadLabelSetIsNeverBlocked: a node that joins
// with the device plugin on and no toolkit (and a misspelt value) is
// created; the findings that would refuse an update are warnings on CREATE.
func TestNodeRegistrationWithABadLabelSetIsNeverBlocked(t *testing.T) {
	g := setUpLab(t)
	const node = `apiVersion: v1
kind: Node
metadata:
  name: lab-node-3
  labels:
    kubernetes.io/hostname: lab-node-3
    nvidia.com/gpu.deploy.device-plugin: "true"
    nvidia.com/gpu.deploy.container-toolkit: "flase"
`
	t.Cleanup(func() { deleteNode(t, "lab-node-3") })
	created := reviews(t, g, "allowed", "CREATE")

	stdout, stderr, code := cp.KubectlWithInput(node, "create", "-f", "-")
	expectResult(t, "kubectl create node lab-node-3 (device-plugin=true, container-toolkit=flase)", result{stdout, stderr, code}, 0,
		"node/lab-node-3 created\n",
		"Warning: lab-node-3: device-plugin would run without container-toolkit; GPU pods would fail to start\n"+
			"Warning: lab-node-3: device-plugin runs on a node with no NVIDIA GPU label\n"+
			"Warning: nvidia.com/gpu.deploy.container-toolkit=\"flase\" is neither true nor false: container-toolkit will not run here\n")
	if now := reviews(t, g, "allowed", "CREATE"); now != created+1 {
		t.Errorf("allowed CREATE reviews went from %v to %v, want +1", created, now)
	}
	waitDesired(t, "nvidia-device-plugin-daemonset", "3")
}

// deleteNode removes a node a test created, and the DaemonSet pods bound to
// it, at once (--force): kwok stops playing a node's kubelet when the node is
// gone, so their graceful deletion would never finish, and the pod GC
// controller that force-deletes such pods is not run.
func deleteNode(t *testing.T, name string) {
	t.Helper()
	if _, stderr, code := cp.Kubectl("delete", "node", name, "--ignore-not-found"); code != 0 {
		t.Errorf("cleanup: kubectl delete node %s: exit %d: %s", name, code, stderr)
	}
	if _, stderr, code := cp.Kubectl("delete", "pods", "-n", operatorNS, "--field-selector", "spec.nodeName="+name,
		"--ignore-not-found", "--grace-period=0", "--force", "--timeout=60s"); code != 0 {
		t.Errorf("cleanup: deleting pods of node %s: exit %d: %s", name, code, stderr)
	}
}

// checkVerdict is the part of `gpu-deploy-guard check -o json` the tests read.
type checkVerdict struct {
	Node     string   `json:"node"`
	Allowed  bool     `json:"allowed"`
	Decision string   `json:"decision"`
	Message  *string  `json:"message"`
	Warnings []string `json:"warnings"`
	Operands struct {
		Before map[string]bool `json:"before"`
		After  map[string]bool `json:"after"`
	} `json:"operands"`
	exit int
}

// predict asks `gpu-deploy-guard check`, with the shipped policy, what the
// webhook will say about these label changes to the node as it is now.
func predict(t *testing.T, node string, changes ...string) checkVerdict {
	t.Helper()
	if guard == nil {
		t.Fatal("predict needs the shared webhook's config file: call setUpLab or useGuard first")
	}
	nodeJSON := cp.MustKubectl(t, "get", "node", node, "-o", "json")
	args := append([]string{"check", "--node", "-", "--config", guard.ConfigFile, "-o", "json"}, changes...)
	cmd := exec.Command(framework.RequireProductBinary(t), args...)
	cmd.Stdin = strings.NewReader(nodeJSON)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	code := 0
	if exitErr, ok := err.(*exec.ExitError); ok {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("gpu-deploy-guard %s: %v", strings.Join(args, " "), err)
	}
	if code != 0 && code != 1 {
		t.Fatalf("gpu-deploy-guard %s: exit %d (bad input)\n%s", strings.Join(args, " "), code, out)
	}
	var v checkVerdict
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("gpu-deploy-guard check -o json printed %q: %v", out, err)
	}
	v.exit = code
	if v.Allowed != (code == 0) {
		t.Fatalf("gpu-deploy-guard check: allowed=%v but exit %d", v.Allowed, code)
	}
	return v
}

// expectAgreesWithCheck: the webhook and `check` run the same decision
// function, so what kubectl printed must be exactly what check predicted:
// its warnings as Warning: lines, and its message as the refusal.
func expectAgreesWithCheck(t *testing.T, predicted checkVerdict, got result) {
	t.Helper()
	var want strings.Builder
	for _, w := range predicted.Warnings {
		want.WriteString("Warning: " + w + "\n")
	}
	if !predicted.Allowed {
		if predicted.Message == nil {
			t.Fatalf("check says denied but gives no message")
		}
		want.WriteString(forbiddenPrefix + *predicted.Message + "\n")
	}
	if got.code != predicted.exit || got.stderr != want.String() {
		t.Errorf("kubectl and `gpu-deploy-guard check` disagree on %s:\nkubectl: exit %d, stderr:\n%s\ncheck:   exit %d, as kubectl would print it:\n%s",
			predicted.Node, got.code, got.stderr, predicted.exit, want.String())
	}
}
