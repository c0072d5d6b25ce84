package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// Changes of the cluster's GPU policy (ClusterPolicy, NVIDIADriver), made
// with kubectl against the GPU Operator's real CRDs (v25.3.4, with their
// schemas and status subresources) and decided by a watching serve over the
// lab's nodes: the webhook configuration points at it for these tests only.

const (
	policyClusterPolicy = "testdata/policy-clusterpolicy.yaml"
	policyOperatorRBAC  = "testdata/policy-operator-rbac.yaml"
	policyReviewsTotal  = metricPrefix + "policy_reviews_total"
	policyForbidden     = `Error from server (Forbidden): admission webhook "policy.gpu-deploy-guard.io" denied the request: `
	hostToolkitKey      = "gpu-deploy-guard.nvidia.com/toolkit-on-hosts"
	// A node label of the suite's own, for NVIDIADriver node selectors.
	driverPoolKey = "e2e.gpu-deploy-guard.io/driver-pool"
	// What Node Feature Discovery sets on a node with an NVIDIA PCI device.
	nfdNvidiaPCI = "feature.node.kubernetes.io/pci-10de.present"
)

// toolkitRefusal is what the guard says of spec.toolkit.enabled true -> false
// while lab-node-0 and lab-node-1 run the device plugin (testdata/lab-nodes.yaml).
const toolkitRefusal = "ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet " +
	"while the NVIDIA device plugin keeps running on 2 nodes (lab-node-0, lab-node-1): " +
	"on containerd nodes the toolkit's exit removes the nvidia runtime (and with CDI on, the device plugin's rollout stalls on it), " +
	"the running device plugins keep advertising GPUs, and GPU pods scheduled there fail to start; " +
	"turn spec.devicePlugin.enabled off in the same change, or, if every host brings its own container toolkit, " +
	"say so in the same request with the annotation " + hostToolkitKey + "=<why> (recorded in the audit log)."

// installOperatorCRDs serves the GPU Operator's own CRDs for ClusterPolicy
// and NVIDIADriver (from the cached operator build) and the ClusterPolicyReport
// stand-in of watched-crds.yaml, until the test ends. The other tests install
// watched-crds.yaml's schema-less ClusterPolicy and delete it when they end;
// one left behind is refused here (create, not apply), not silently replaced.
func installOperatorCRDs(t *testing.T) {
	t.Helper()
	build, err := framework.BuildOperator()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(watchedCRDs)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := framework.SplitManifests(data)
	if err != nil {
		t.Fatal(err)
	}
	report, err := framework.Find(objs, "CustomResourceDefinition", "clusterpolicyreports.wgpolicyk8s.io")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if got := kubectl("delete", "-f", build.CRDDir(), "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete -f %s: %s", build.CRDDir(), got)
		}
		if got := kubectl("delete", "crd", report.Name, "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete crd %s: %s", report.Name, got)
		}
	})
	cp.MustKubectl(t, "create", "-f", build.CRDDir())
	if got := kubectlWithInput(string(report.YAML), "create", "-f", "-"); got.code != 0 {
		t.Fatalf("kubectl create crd %s: %s", report.Name, got)
	}
	cp.WaitCRDsServed(t, "clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", report.Name)
}

// devicePluginStops is the warning for the device plugin switched off over
// the lab's two device-plugin nodes.
const devicePluginStops = "ClusterPolicy cluster-policy: the device plugin stops on 2 nodes (lab-node-0, lab-node-1); their GPUs are no longer advertised"

// operandsLoseTheRuntime is the warning for the toolkit switched off with the
// device plugin: GFD and the DCGM exporter of the lab's nodes keep their
// `nvidia` runtime class, which the leaving toolkit removes.
const operandsLoseTheRuntime = "ClusterPolicy cluster-policy: operand-without-toolkit on 2 nodes (lab-node-0, lab-node-1)"

// setUpPolicyLab resets the lab, serves the operator's CRDs and points the
// webhook configuration at a watching serve, which it returns. lab-node-0
// and lab-node-1 carry the label NFD gives a node with an NVIDIA GPU
// (testdata/lab-nodes.yaml): the GPU Operator's labelling pass (which the
// policy decision runs before judging) sweeps every deploy label off a node
// with gpu.present=true but no NFD GPU label. Everything is undone when the
// test ends; the shared webhook is registered again first.
func setUpPolicyLab(t *testing.T) *framework.Guard {
	t.Helper()
	setUpLab(t)
	t.Cleanup(func() { restoreLab(t) })
	installOperatorCRDs(t)
	return registerWatchingGuard(t)
}

// policyReviews reads the watching guard's policy_reviews_total for one
// kind, decision and operation ("" matches any).
func policyReviews(t *testing.T, g *framework.Guard, kind, decision, operation string) float64 {
	t.Helper()
	match := map[string]string{}
	for k, v := range map[string]string{"kind": kind, "decision": decision, "operation": operation} {
		if v != "" {
			match[k] = v
		}
	}
	v, err := g.Counter(policyReviewsTotal, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// clusterPolicyManifest is testdata/policy-clusterpolicy.yaml with the
// `enabled:` line of each named component (driver, toolkit, devicePlugin,
// ...) set to the given value.
func clusterPolicyManifest(t *testing.T, enabled map[string]bool) string {
	t.Helper()
	data, err := os.ReadFile(policyClusterPolicy)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for component, on := range enabled {
		old := fmt.Sprintf("  %s:\n    enabled: true\n", component)
		if strings.Count(text, old) != 1 {
			t.Fatalf("%s has no single %q", policyClusterPolicy, old)
		}
		text = strings.Replace(text, old, fmt.Sprintf("  %s:\n    enabled: %t\n", component, on), 1)
	}
	return text
}

// clusterPolicySwitches is the ClusterPolicy's driver, toolkit and device
// plugin switches as stored: "driver=true toolkit=true devicePlugin=true".
func clusterPolicySwitches(t *testing.T) string {
	t.Helper()
	return cp.MustKubectl(t, "get", "clusterpolicy", clusterPolicyName, "-o",
		"jsonpath=driver={.spec.driver.enabled} toolkit={.spec.toolkit.enabled} devicePlugin={.spec.devicePlugin.enabled}")
}

const policyAsShipped = "driver=true toolkit=true devicePlugin=true"

// createClusterPolicy applies policyClusterPolicy, which takes nothing away
// (a first ClusterPolicy: created, silently), deletes it when the test ends,
// and waits for the guard to decide over the lab's nodes.
func createClusterPolicy(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		if got := kubectl("delete", "clusterpolicy", clusterPolicyName, "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	expectResult(t, "kubectl apply -f "+policyClusterPolicy, kubectlWithInput(clusterPolicyManifest(t, nil), "apply", "-f", "-"),
		0, "clusterpolicy.nvidia.com/cluster-policy created\n", "")
	waitFleetKnown(t)
}

// waitFleetKnown repeats a server-side dry run of the toolkit switch-off
// until the guard refuses it naming the lab's nodes: serve's watch has
// listed them (before that it decides on the policy alone and says so).
func waitFleetKnown(t *testing.T) {
	t.Helper()
	want := result{"", policyForbidden + toolkitRefusal + "\n", 1}
	framework.WaitFor(t, watchFollow, "the watching guard to decide over the lab's nodes", func() (bool, string) {
		got := kubectl("patch", "clusterpolicy", clusterPolicyName, "--type=merge",
			"-p", `{"spec":{"toolkit":{"enabled":false}}}`, "--dry-run=server")
		return got == want, got.String()
	})
}

// policyDenied is how the API server words the policy webhook's refusal.
const policyDenied = `admission webhook "policy.gpu-deploy-guard.io" denied the request: `

// expectApplyRefused checks what `kubectl apply -f -` prints when admission
// refuses the patch it computed: the patch itself, then the refusal.
func expectApplyRefused(t *testing.T, what string, got result, message string) {
	t.Helper()
	if got.code != 1 || got.stdout != "" ||
		!strings.HasPrefix(got.stderr, "Error from server (Forbidden): error when applying patch:\n") ||
		!strings.HasSuffix(got.stderr, "\nfor: \"STDIN\": error when patching \"STDIN\": "+policyDenied+message+"\n") {
		t.Fatalf("%s: want refused by the policy webhook with %q\ngot %s", what, message, got)
	}
	t.Logf("%s:\n%s", what, got)
}

// TestClusterPolicyToolkitSwitchOffIsRefusedEveryWayKubectlWritesIt: with
// the operator's CRD and the lab's device plugins running on lab-node-0 and
// lab-node-1, turning the managed container toolkit off is refused, naming
// those nodes and the annotation that says the hosts bring their own, whether
// it comes as a merge patch, a server-side dry run, `kubectl apply` of a
// changed manifest, `kubectl replace` of the edited object or `kubectl edit`.
// Nothing is stored, and the refusal is counted as a denied ClusterPolicy
// UPDATE. The GPU Operator's own service account is not asked (the
// webhook's matchConditions), and a person who says the hosts bring the
// toolkit, with the annotation in the same patch, passes.
func TestClusterPolicyToolkitSwitchOffIsRefusedEveryWayKubectlWritesIt(t *testing.T) {
	g := setUpPolicyLab(t)
	createClusterPolicy(t)
	refused := policyForbidden + toolkitRefusal + "\n"
	toolkitOff := `{"spec":{"toolkit":{"enabled":false}}}`

	denied := policyReviews(t, g, "ClusterPolicy", "denied", "UPDATE")
	expectResult(t, "kubectl patch clusterpolicy toolkit.enabled=false",
		kubectl("patch", "clusterpolicy", clusterPolicyName, "--type", "merge", "-p", toolkitOff), 1, "", refused)
	if now := policyReviews(t, g, "ClusterPolicy", "denied", "UPDATE"); now != denied+1 {
		t.Errorf("policy_reviews_total{kind=ClusterPolicy,decision=denied,operation=UPDATE} went from %v to %v on one refused patch, want +1", denied, now)
	}
	expectResult(t, "kubectl patch clusterpolicy toolkit.enabled=false --dry-run=server",
		kubectl("patch", "clusterpolicy", clusterPolicyName, "--type", "merge", "-p", toolkitOff, "--dry-run=server"), 1, "", refused)

	// kubectl apply of the manifest with toolkit.enabled: false.
	expectApplyRefused(t, "kubectl apply -f (toolkit.enabled: false)",
		kubectlWithInput(clusterPolicyManifest(t, map[string]bool{"toolkit": false}), "apply", "-f", "-"), toolkitRefusal)
	// kubectl replace of the stored object, edited: an UPDATE (PUT).
	var stored map[string]any
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "clusterpolicy", clusterPolicyName, "-o", "json")), &stored); err != nil {
		t.Fatal(err)
	}
	stored["spec"].(map[string]any)["toolkit"].(map[string]any)["enabled"] = false
	edited, err := json.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	expectResult(t, "kubectl replace -f (the stored object with toolkit.enabled false)", kubectlWithInput(string(edited), "replace", "-f", "-"),
		1, "", `Error from server (Forbidden): error when replacing "STDIN": `+policyDenied+toolkitRefusal+"\n")
	// kubectl edit, with an editor that turns the toolkit off.
	tmp := t.TempDir()
	editor := filepath.Join(tmp, "editor.sh")
	if err := os.WriteFile(editor, []byte("#!/bin/sh\nsed -i '/^  toolkit:$/,/enabled:/ s/enabled: true/enabled: false/' \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBE_EDITOR", editor)
	t.Setenv("TMPDIR", tmp) // where kubectl edit keeps the refused edit
	got := kubectl("edit", "clusterpolicy", clusterPolicyName)
	if got.code != 1 || got.stdout != "" ||
		!strings.HasPrefix(got.stderr, `error: clusterpolicies.nvidia.com "cluster-policy" could not be patched: `+policyDenied+toolkitRefusal+"\nYou can run `") ||
		!strings.HasSuffix(got.stderr, "` to try this update again.\n") {
		t.Fatalf("kubectl edit clusterpolicy (toolkit.enabled: false): want refused by the policy webhook\ngot %s", got)
	}
	t.Logf("kubectl edit clusterpolicy (toolkit.enabled: false):\n%s", got)
	if got := clusterPolicySwitches(t); got != policyAsShipped {
		t.Errorf("after the refused patch, apply, replace and edit the ClusterPolicy has %s, want %s", got, policyAsShipped)
	}
	if now := policyReviews(t, g, "ClusterPolicy", "denied", "UPDATE"); now != denied+5 {
		t.Errorf("denied ClusterPolicy UPDATE reviews went from %v to %v after five refused writes, want +5", denied, now)
	}

	// The GPU Operator's own write: its service account is never sent to the
	// webhook (matchConditions), so it is neither refused nor delayed.
	t.Cleanup(func() {
		if got := kubectl("delete", "-f", policyOperatorRBAC, "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	cp.MustKubectl(t, "apply", "-f", policyOperatorRBAC)
	cp.WaitForKubectlOutput(t, watchFollow, "yes", "auth", "can-i", "patch", "clusterpolicies.nvidia.com", "--as="+operatorSA)
	all := policyReviews(t, g, "", "", "")
	expectResult(t, "kubectl patch clusterpolicy toolkit.enabled=false --as="+operatorSA,
		kubectlAsOperator("patch", "clusterpolicy", clusterPolicyName, "--type", "merge", "-p", toolkitOff),
		0, "clusterpolicy.nvidia.com/cluster-policy patched\n", "")
	if now := policyReviews(t, g, "", "", ""); now != all {
		t.Errorf("policy_reviews_total went from %v to %v on the operator's own write, want unchanged (not sent to the webhook)", all, now)
	}
	if got := clusterPolicySwitches(t); got != "driver=true toolkit=false devicePlugin=true" {
		t.Errorf("after the operator's patch the ClusterPolicy has %s, want toolkit=false", got)
	}
	// Turning the toolkit on again takes nothing away.
	expectResult(t, "kubectl patch clusterpolicy toolkit.enabled=true",
		kubectl("patch", "clusterpolicy", clusterPolicyName, "--type", "merge", "-p", `{"spec":{"toolkit":{"enabled":true}}}`),
		0, "clusterpolicy.nvidia.com/cluster-policy patched\n", "")

	// The same patch, saying the hosts bring their own toolkit: allowed.
	expectResult(t, "kubectl patch clusterpolicy toolkit.enabled=false with "+hostToolkitKey,
		kubectl("patch", "clusterpolicy", clusterPolicyName, "--type", "merge",
			"-p", `{"metadata":{"annotations":{"`+hostToolkitKey+`":"the lab's hosts run nvidia-ctk"}},"spec":{"toolkit":{"enabled":false}}}`),
		0, "clusterpolicy.nvidia.com/cluster-policy patched\n", "")
	if got := clusterPolicySwitches(t); got != "driver=true toolkit=false devicePlugin=true" {
		t.Errorf("after the patch with %s the ClusterPolicy has %s, want toolkit=false", hostToolkitKey, got)
	}
}

// TestClusterPolicyChangesThatKeepTheToolkitUnderThePluginPass: consistent
// and unrelated ClusterPolicy changes pass. The toolkit and the device plugin
// off together; an unrelated spec change and an annotation, without a
// warning; the status subresource, which the webhook is never asked about;
// and driver.enabled true -> false, allowed with a warning kubectl prints,
// naming the node that loses its driver DaemonSet (lab-node-0; lab-node-1
// has driver=false).
func TestClusterPolicyChangesThatKeepTheToolkitUnderThePluginPass(t *testing.T) {
	g := setUpPolicyLab(t)
	createClusterPolicy(t)
	patched := "clusterpolicy.nvidia.com/cluster-policy patched\n"
	patch := func(p string) result {
		return kubectl("patch", "clusterpolicy", clusterPolicyName, "--type", "merge", "-p", p)
	}

	denied := policyReviews(t, g, "", "denied", "")
	allowed := policyReviews(t, g, "ClusterPolicy", "allowed", "UPDATE")
	expectResult(t, "kubectl patch clusterpolicy dcgmExporter.serviceMonitor.enabled=true",
		patch(`{"spec":{"dcgmExporter":{"serviceMonitor":{"enabled":true}}}}`), 0, patched, "")
	expectResult(t, "kubectl annotate clusterpolicy",
		kubectl("annotate", "clusterpolicy", clusterPolicyName, "e2e.gpu-deploy-guard.io/owner=lab"),
		0, "clusterpolicy.nvidia.com/cluster-policy annotated\n", "")
	if now := policyReviews(t, g, "ClusterPolicy", "allowed", "UPDATE"); now != allowed+2 {
		t.Errorf("allowed ClusterPolicy UPDATE reviews went from %v to %v after two unrelated changes, want +2", allowed, now)
	}

	// Status: the operator's; the webhook's rules do not cover the subresource.
	all := policyReviews(t, g, "", "", "")
	expectResult(t, "kubectl patch clusterpolicy --subresource=status",
		kubectl("patch", "clusterpolicy", clusterPolicyName, "--subresource=status", "--type", "merge", "-p", `{"status":{"state":"notReady"}}`),
		0, patched, "")
	if now := policyReviews(t, g, "", "", ""); now != all {
		t.Errorf("policy_reviews_total went from %v to %v on a status update, want unchanged", all, now)
	}
	cp.WaitForKubectlOutput(t, watchFollow, "notReady", "get", "clusterpolicy", clusterPolicyName, "-o", "jsonpath={.status.state}")

	// Consistent, so allowed; the nodes that stop advertising their GPUs are named.
	expectResult(t, "kubectl patch clusterpolicy toolkit.enabled=false devicePlugin.enabled=false",
		patch(`{"spec":{"toolkit":{"enabled":false},"devicePlugin":{"enabled":false}}}`), 0, patched,
		"Warning: "+devicePluginStops+"\nWarning: "+operandsLoseTheRuntime+"\n")
	if got := clusterPolicySwitches(t); got != "driver=true toolkit=false devicePlugin=false" {
		t.Errorf("after switching both off the ClusterPolicy has %s", got)
	}
	expectResult(t, "kubectl patch clusterpolicy toolkit.enabled=true devicePlugin.enabled=true",
		patch(`{"spec":{"toolkit":{"enabled":true},"devicePlugin":{"enabled":true}}}`), 0, patched, "")

	expectResult(t, "kubectl patch clusterpolicy driver.enabled=false",
		patch(`{"spec":{"driver":{"enabled":false}}}`), 0, patched,
		"Warning: ClusterPolicy cluster-policy: 1 node loses the driver DaemonSet (lab-node-0)\n")
	if got := clusterPolicySwitches(t); got != "driver=false toolkit=true devicePlugin=true" {
		t.Errorf("after driver.enabled=false the ClusterPolicy has %s", got)
	}
	if now := policyReviews(t, g, "", "denied", ""); now != denied {
		t.Errorf("denied policy reviews went from %v to %v, want none denied", denied, now)
	}
}

// nvidiaDriver is an NVIDIADriver manifest with what the CRD requires
// (driverType, image) and the fields a real one has; selector is the JSON of
// spec.nodeSelector ("" leaves it out).
func nvidiaDriver(name, selector string) string {
	sel := ""
	if selector != "" {
		sel = `,"nodeSelector":` + selector
	}
	return fmt.Sprintf(`{"apiVersion":"nvidia.com/v1alpha1","kind":"NVIDIADriver","metadata":{"name":%q},`+
		`"spec":{"driverType":"gpu","image":"driver","repository":"nvcr.io/nvidia","version":"570.172.08"%s}}`, name, sel)
}

// NFD's OS labels, which put a node in an NVIDIADriver's pool.
const (
	nfdOSID      = "feature.node.kubernetes.io/system-os_release.ID"
	nfdOSVersion = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
)

// setUpDriverPools gives the policy lab a ClusterPolicy with
// driver.useNvidiaDriverCRD, lab-node-0 and lab-node-1 in driver pools a and b
// (with NFD's OS labels: the operator runs an NVIDIADriver's DaemonSets per
// OS pool, and a node without them gets no driver pod), and NVIDIADriver
// pool-a for pool a; every NVIDIADriver and the ClusterPolicy are deleted
// when the test ends.
func setUpDriverPools(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		for _, args := range [][]string{
			{"delete", "nvidiadrivers", "--all", "--ignore-not-found"},
			{"delete", "clusterpolicy", clusterPolicyName, "--ignore-not-found"},
		} {
			if got := kubectl(args...); got.code != 0 {
				t.Errorf("cleanup: kubectl %s: %s", strings.Join(args, " "), got)
			}
		}
	})
	manifest := strings.Replace(clusterPolicyManifest(t, nil), "  driver:\n    enabled: true\n",
		"  driver:\n    enabled: true\n    useNvidiaDriverCRD: true\n", 1)
	expectResult(t, "kubectl apply -f "+policyClusterPolicy+" (driver.useNvidiaDriverCRD: true)", kubectlWithInput(manifest, "apply", "-f", "-"),
		0, "clusterpolicy.nvidia.com/cluster-policy created\n", "")
	for node, pool := range map[string]string{"lab-node-0": "a", "lab-node-1": "b"} {
		expectResult(t, "kubectl label node "+node+" "+driverPoolKey+"="+pool+" (and NFD's OS labels)",
			kubectl("label", "node", node, driverPoolKey+"="+pool, nfdOSID+"=ubuntu", nfdOSVersion+"=22.04"), 0, "node/"+node+" labeled\n", "")
	}
	expectResult(t, "kubectl create NVIDIADriver pool-a", kubectlWithInput(nvidiaDriver("pool-a", `{"`+driverPoolKey+`":"a"}`), "create", "-f", "-"),
		0, "nvidiadriver.nvidia.com/pool-a created\n", "")
}

// TestNVIDIADriverOverlapIsRefusedAndARemovedDriverWarned: NVIDIADriver
// pool-a selects lab-node-0 by a pool label of the suite's. A second one
// with an empty nodeSelector (every node) is refused, naming both and
// lab-node-0; one for another pool (lab-node-1) is created. Deleting pool-a
// leaves lab-node-0 (driver=true, a GPU) without a driver DaemonSet: allowed,
// with a warning naming it.
func TestNVIDIADriverOverlapIsRefusedAndARemovedDriverWarned(t *testing.T) {
	g := setUpPolicyLab(t)
	setUpDriverPools(t)
	overlap := "NVIDIADriver everywhere: its nodeSelector selects 1 node that NVIDIADriver pool-a selects too (lab-node-0); " +
		"the GPU Operator runs one driver per node and reports the conflict only when it reconciles: make the two nodeSelectors select different nodes."
	everywhere := nvidiaDriver("everywhere", `{}`)
	// serve learns about pool-a and the pool labels through its watch.
	want := result{"", `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied + overlap + "\n", 1}
	framework.WaitFor(t, watchFollow, "the watching guard to refuse an NVIDIADriver overlapping pool-a", func() (bool, string) {
		got := kubectlWithInput(everywhere, "create", "-f", "-", "--dry-run=server")
		return got == want, got.String()
	})
	denied := policyReviews(t, g, "NVIDIADriver", "denied", "CREATE")
	expectResult(t, "kubectl create NVIDIADriver everywhere (nodeSelector {})", kubectlWithInput(everywhere, "create", "-f", "-"),
		want.code, want.stdout, want.stderr)
	if now := policyReviews(t, g, "NVIDIADriver", "denied", "CREATE"); now != denied+1 {
		t.Errorf("denied NVIDIADriver CREATE reviews went from %v to %v, want +1", denied, now)
	}
	expectResult(t, "kubectl get nvidiadrivers", kubectl("get", "nvidiadrivers", "-o", "name"), 0, "nvidiadriver.nvidia.com/pool-a\n", "")

	// An NVIDIADriver on a label the guard's node records do not keep (kubernetes.io/hostname):
	// its overlap with pool-a cannot be checked, so it is refused and the guard reads the label;
	// sent again, it is refused for the overlap itself. Never created either way.
	byHost := nvidiaDriver("by-host", `{"kubernetes.io/hostname":"lab-node-0"}`)
	unread := `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied +
		"NVIDIADriver by-host: its nodeSelector reads kubernetes.io/hostname, which the guard had not read from the nodes: " +
		"which nodes it selects, and so its overlap with the other NVIDIADrivers, cannot be checked yet; " +
		"the guard reads that label from the nodes now: retry in a few seconds.\n"
	expectResult(t, "kubectl create NVIDIADriver by-host (kubernetes.io/hostname, not read yet)", kubectlWithInput(byHost, "create", "-f", "-"),
		1, "", unread)
	byHostOverlap := `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied +
		"NVIDIADriver by-host: its nodeSelector selects 1 node that NVIDIADriver pool-a selects too (lab-node-0); " +
		"the GPU Operator runs one driver per node and reports the conflict only when it reconciles: make the two nodeSelectors select different nodes.\n"
	framework.WaitFor(t, watchFollow, "NVIDIADriver by-host refused for its overlap once the guard reads the hostname label", func() (bool, string) {
		got := kubectlWithInput(byHost, "create", "-f", "-")
		if got.code != 1 || (got.stderr != unread && got.stderr != byHostOverlap) {
			t.Fatalf("kubectl create NVIDIADriver by-host: want refused\ngot %s", got)
		}
		return got.stderr == byHostOverlap, got.String()
	})
	expectResult(t, "kubectl get nvidiadrivers", kubectl("get", "nvidiadrivers", "-o", "name"), 0, "nvidiadriver.nvidia.com/pool-a\n", "")
	// pool-a's selector key was read from the nodes that carry it, not by listing the fleet again.
	if log, err := os.ReadFile(g.LogPath()); err != nil {
		t.Fatal(err)
	} else if !strings.Contains(string(log), "read them from the nodes that carry them") || strings.Contains(string(log), "listing the nodes again") {
		t.Errorf("the watching guard's log should say it read %s from the nodes that carry it, and never list the nodes again:\n%s", driverPoolKey, log)
	}

	expectResult(t, "kubectl create NVIDIADriver pool-b", kubectlWithInput(nvidiaDriver("pool-b", `{"`+driverPoolKey+`":"b"}`), "create", "-f", "-"),
		0, "nvidiadriver.nvidia.com/pool-b created\n", "")

	expectResult(t, "kubectl delete NVIDIADriver pool-a", kubectl("delete", "nvidiadriver", "pool-a"),
		0, `nvidiadriver.nvidia.com "pool-a" deleted`+"\n", "Warning: NVIDIADriver pool-a: 1 node loses the driver DaemonSet (lab-node-0)\n")
}

// gpuClusterCRD is the GPUCluster stand-in of testdata/watched-crds.yaml: the
// operator built for the suite (v25.3.4) has no GPUCluster, which v26.7 adds.
func gpuClusterCRD(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(watchedCRDs)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.Contains(doc, "name: gpuclusters.nvidia.com") {
			return doc
		}
	}
	t.Fatalf("%s has no gpuclusters.nvidia.com", watchedCRDs)
	return ""
}

// TestClusterPolicyAndGPUClusterAtOnceAreRefused: the GPU Operator v26.7
// reconciles nothing while a ClusterPolicy and a GPUCluster both exist. The
// guard (following v26.7, the version it assumes here) refuses the GPUCluster
// created beside the lab's ClusterPolicy, and, once the ClusterPolicy is gone
// and the GPUCluster made, the ClusterPolicy created beside it.
func TestClusterPolicyAndGPUClusterAtOnceAreRefused(t *testing.T) {
	setUpPolicyLab(t)
	crd := gpuClusterCRD(t)
	t.Cleanup(func() {
		if got := kubectl("delete", "gpucluster", "gpu-cluster", "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
		if got := kubectlWithInput(crd, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete crd gpuclusters.nvidia.com: %s", got)
		}
	})
	if got := kubectlWithInput(crd, "apply", "-f", "-"); got.code != 0 {
		t.Fatalf("kubectl apply of the GPUCluster CRD: %s", got)
	}
	cp.WaitCRDsServed(t, "gpuclusters.nvidia.com")
	createClusterPolicy(t)

	gpuCluster := "apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\nspec: {}\n"
	refused := result{"", `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied + "GPUCluster gpu-cluster: ClusterPolicy cluster-policy exists, and the GPU Operator (v26.7) " +
		"reconciles neither while both exist: it labels no node and deploys nothing until one is deleted; " +
		"delete ClusterPolicy cluster-policy first, or do not create GPUCluster gpu-cluster.\n", 1}
	// The guard learns of the ClusterPolicy from its watch, within its debounce: dry runs
	// until it does, then the real request.
	framework.WaitFor(t, watchFollow, "GPUCluster gpu-cluster refused beside ClusterPolicy cluster-policy (dry run)", func() (bool, string) {
		got := kubectlWithInput(gpuCluster, "create", "-f", "-", "--dry-run=server")
		return got == refused, got.String()
	})
	expectResult(t, "kubectl create GPUCluster gpu-cluster beside ClusterPolicy cluster-policy",
		kubectlWithInput(gpuCluster, "create", "-f", "-"), refused.code, refused.stdout, refused.stderr)

	cp.MustKubectl(t, "delete", "clusterpolicy", clusterPolicyName)
	// The guard learns that the ClusterPolicy is gone within its debounce.
	framework.WaitFor(t, watchFollow, "GPUCluster gpu-cluster created once no ClusterPolicy exists", func() (bool, string) {
		got := kubectlWithInput(gpuCluster, "create", "-f", "-")
		return got.code == 0, got.String()
	})
	want := result{"", `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied + "ClusterPolicy cluster-policy: GPUCluster gpu-cluster exists, and the GPU " +
		"Operator (v26.7) reconciles neither while both exist: it labels no node and deploys nothing until one is " +
		"deleted; delete GPUCluster gpu-cluster first, or do not create ClusterPolicy cluster-policy.\n", 1}
	framework.WaitFor(t, watchFollow, "ClusterPolicy cluster-policy refused beside GPUCluster gpu-cluster", func() (bool, string) {
		got := kubectlWithInput(clusterPolicyManifest(t, nil), "create", "-f", "-", "--dry-run=server")
		return got == want, got.String()
	})
	if got := kubectl("get", "clusterpolicy", "-o", "name"); got.stdout != "" {
		t.Errorf("a refused ClusterPolicy was stored: %s", got)
	}
}
