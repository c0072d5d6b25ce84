package oracle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The NVIDIADriver test's labels: NFD's OS labels put a node in an OS pool
// (the NVIDIADriver controller makes one DaemonSet per pool and skips a node
// without them, internal/state/nodepool.go getNodePools), NFD's kernel label
// lets the ClusterPolicy render its driver's image (resolveDriverTag reads
// it from the first GPU node listed, in no set order), the hostname label is
// the driver pods' anti-affinity topology key, and the pool label is the
// test's own, for the NVIDIADriver's nodeSelector.
const (
	nfdOSID      = "feature.node.kubernetes.io/system-os_release.ID"
	nfdOSVersion = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	nfdKernelKey = "feature.node.kubernetes.io/kernel-version.full"
	ndKernel     = "5.15.0-1026-nvidia"
	hostnameKey  = "kubernetes.io/hostname"
	ndPoolKey    = "oracle.gpu-deploy-guard.io/pool"
	ndName       = "oracle-nd"
	driverLabel  = deployPrefix + "driver"
	driverPods   = "app.kubernetes.io/component=nvidia-driver"
)

// ndNode is one of the test's GPU nodes: its pool label and NFD OS.
type ndNode struct{ name, pool, osID, osVersion string }

var ndNodes = []ndNode{
	{"oracle-nd-a1", "a", "ubuntu", "22.04"},
	{"oracle-nd-a2", "a", "rhel", "9.4"},
	{"oracle-nd-a3", "a", "", ""}, // no NFD OS labels: no pool
	{"oracle-nd-b1", "b", "ubuntu", "22.04"},
	{"oracle-nd-b2", "b", "ubuntu", "24.04"},
	{"oracle-nd-x", "", "ubuntu", "22.04"}, // no pool label
}

// ndStep is one change of the NVIDIADriver: its nodeSelector's pool after
// it; "" deletes it. The first creates it.
type ndStep struct{ name, pool string }

var ndSteps = []ndStep{
	{"create with nodeSelector pool=a", "a"},
	{"nodeSelector pool=a -> pool=b", "b"},
	{"nodeSelector pool=b -> pool=c, which no node has", "c"},
	{"delete", ""},
}

// TestNVIDIADriverChangesAgreeWithOperator: the ClusterPolicy's driver on,
// then spec.driver.useNvidiaDriverCRD true, then false. With the flag in
// each position, an NVIDIADriver is created, its nodeSelector changed twice
// (the second time to a pool no node is in) and it is deleted. For each
// change, what `check-policy` predicts over the live nodes, ClusterPolicy,
// DaemonSets and other NVIDIADrivers is what the real v25.3.4 operator then
// does, node by node: whether any driver DaemonSet (the ClusterPolicy's, or
// one the NVIDIADriver controls) selects the node before and after; and the
// findings: driver-removed names the nodes every driver DaemonSet leaves,
// driver-selected-twice those a second one comes to select, and
// nvidia-driver-not-reconciled comes exactly when the operator applies none
// of the change.
func TestNVIDIADriverChangesAgreeWithOperator(t *testing.T) {
	o := setUp(t)
	if o.build.Version != "v25.3.4" {
		t.Fatalf("the steps are chosen for GPU Operator v25.3.4; this build is %s", o.build.Version)
	}
	if _, _, code := cp.Kubectl("get", "nvidiadriver", ndName); code == 0 {
		t.Fatalf("NVIDIADriver %s exists before the test", ndName)
	}
	start := time.Now()
	var kernelled []string
	t.Cleanup(func() { cleanUpNVIDIADriverTest(t, o, kernelled) })
	for _, n := range ndNodes {
		l := labels(nfd, hostnameKey+"="+n.name, nfdKernelKey+"="+ndKernel)
		if n.pool != "" {
			l[ndPoolKey] = n.pool
		}
		if n.osID != "" {
			l[nfdOSID], l[nfdOSVersion] = n.osID, n.osVersion
		}
		createNode(t, n.name, l)
	}
	o.settle(t)
	kernelled = labelKernels(t)
	// The driver on through the ClusterPolicy first, as before a move to
	// NVIDIADrivers: switching the flag on then deletes its DaemonSet.
	setDriverCRD(t, o, false)
	work := t.TempDir()
	for _, crd := range []bool{true, false} {
		setDriverCRD(t, o, crd)
		for i, s := range ndSteps {
			runNDStep(t, o, fmt.Sprintf("useNvidiaDriverCRD=%v, %s", crd, s.name), s, filepath.Join(work, fmt.Sprintf("%v-%d", crd, i)))
		}
	}
	t.Logf("the NVIDIADriver test took %s (after the operator's set-up)", time.Since(start).Round(time.Second))
}

// labelKernels gives NFD's kernel label to every GPU node without one (the
// other tests' nodes), so that the ClusterPolicy's driver renders whichever
// node the operator lists first; it returns the nodes it labelled.
func labelKernels(t *testing.T) []string {
	t.Helper()
	names := strings.Fields(cp.MustKubectl(t, "get", "nodes", "-l", gpuPresent+"=true,!"+nfdKernelKey,
		"-o", "jsonpath={.items[*].metadata.name}"))
	for _, n := range names {
		cp.MustKubectl(t, "label", "node", n, nfdKernelKey+"="+ndKernel)
	}
	return names
}

// setDriverCRD switches the ClusterPolicy's driver on with
// useNvidiaDriverCRD as given, and waits for the operator to delete (on) or
// create (off) its driver DaemonSet and the DaemonSet controller to follow.
// The driver's auto-upgrade goes off: the ClusterPolicy's driver image tag
// follows the OS of the GPU node the operator happens to list first, so
// here its DaemonSet is re-rendered at each reconcile, and the upgrade
// controller would cordon node after node to restart driver pods.
func setDriverCRD(t *testing.T, o *oracle, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"driver":{"enabled":true,"useNvidiaDriverCRD":%v,"upgradePolicy":{"autoUpgrade":false}}}}`, on)
	stdout, stderr, code := cp.Kubectl("patch", "clusterpolicy", o.policyName, "--type=merge", "-p", patch)
	if code != 0 {
		t.Fatalf("driver on, useNvidiaDriverCRD=%v: kubectl patch: exit %d\n%s\n%s", on, code, stdout, stderr)
	}
	t.Logf("driver on, useNvidiaDriverCRD=%v: %s%s", on, stdout, stderr)
	o.settle(t)
	framework.WaitFor(t, catchUp, fmt.Sprintf("the ClusterPolicy's driver DaemonSet to be there=%v, and the driver DaemonSets settled", !on),
		func() (bool, string) {
			v, pending := readDrivers(t)
			if (len(v.clusterPolicy) > 0) == on {
				return false, fmt.Sprintf("ClusterPolicy driver DaemonSets: %v", v.clusterPolicy)
			}
			return pending == "", pending
		})
}

// runNDStep predicts the step with check-policy, compares the prediction's
// "before" with the driver DaemonSets, makes the change with kubectl, waits
// for the operator and the DaemonSet controller, and compares the rest.
func runNDStep(t *testing.T, o *oracle, step string, s ndStep, dir string) {
	t.Helper()
	t.Logf("step: %s", step)
	before := waitDrivers(t, step+": the driver DaemonSets to settle before the change")
	oldJSON := cp.MustKubectl(t, "get", "nvidiadriver", ndName, "-o", "json", "--ignore-not-found")
	newJSON := ""
	if s.pool != "" {
		args, stdin := ndKubectl(s, oldJSON != "", true)
		var stderr string
		var code int
		if newJSON, stderr, code = cp.KubectlWithInput(stdin, args...); code != 0 {
			t.Fatalf("%s: the server's dry run: exit %d\n%s\n%s", step, code, newJSON, stderr)
		}
	}
	got := predictND(t, o, dir, oldJSON, newJSON)
	if got.Decision != "allowed" {
		t.Fatalf("%s: check-policy says %s: %s", step, got.Decision, deref(got.Message))
	}
	sh := driverShift(got.Operands)
	t.Logf("  check-policy: driver %d -> %d nodes, starts on %v, stops on %v", sh.Before, sh.After, sh.Starts, sh.Stops)
	for _, f := range got.Findings {
		t.Logf("  check-policy: %s %s: %s", f.Action, f.Rule, f.Message)
	}
	for _, d := range ndBeforeDiffs(sh, before) {
		t.Errorf("%s: before the change: %s", step, d)
	}

	uid := cp.MustKubectl(t, "get", "nvidiadriver", ndName, "-o", "jsonpath={.metadata.uid}", "--ignore-not-found")
	n := strings.Count(o.op.Log(), reconcilingNVIDIADriver)
	args, stdin := ndKubectl(s, oldJSON != "", false)
	stdout, stderr, code := cp.KubectlWithInput(stdin, args...)
	if code != 0 {
		t.Fatalf("%s: check-policy allowed it, kubectl says exit %d\n%s\n%s", step, code, stdout, stderr)
	}
	t.Logf("  kubectl: %s%s", stdout, stderr)
	if s.pool == "" {
		waitNDCollected(t, step, uid)
	} else {
		waitNDReconciled(t, o, step, n)
		t.Logf("  the NVIDIADriver's status: %s", cp.MustKubectl(t, "get", "nvidiadriver", ndName, "-o",
			`jsonpath={.status.state}; Error: {.status.conditions[?(@.type=="Error")].message}`))
	}

	// The comparison, retried for a while: the operator requeues a driver
	// that is not ready every 5 s, and each reconcile may clean up again.
	var after driverView
	var diffs []string
	for deadline := time.Now().Add(ndAgreement); ; time.Sleep(2 * time.Second) {
		after = waitDrivers(t, step+": the driver DaemonSets to settle after the change")
		diffs = append(ndAfterDiffs(sh, before, after), ndFindingDiffs(got.Findings, s, before, after)...)
		if len(diffs) == 0 || time.Now().After(deadline) {
			break
		}
	}
	logNDTable(t, step, sh, before, after)
	for _, d := range diffs {
		t.Errorf("%s: %s", step, d)
	}
}

// waitDrivers waits for the driver DaemonSets to settle (what) and returns them.
func waitDrivers(t *testing.T, what string) driverView {
	t.Helper()
	var v driverView
	framework.WaitFor(t, catchUp, what, func() (bool, string) {
		var pending string
		v, pending = readDrivers(t)
		return pending == "", pending
	})
	return v
}

// ndAgreement bounds the retries of a step's comparison after the operator's
// reconcile; only a disagreement waits this long.
const ndAgreement = 6 * time.Second

// reconcilingNVIDIADriver begins each reconcile's log (Reconcile).
const reconcilingNVIDIADriver = "Reconciling NVIDIADriver"

// waitNDReconciled returns once a reconcile of the NVIDIADriver controller
// that began after the change (the log had n such lines before it) has
// ended. Its reconciles run one at a time (MaxConcurrentReconciles 1) and a
// ClusterPolicy spec change enqueues every NVIDIADriver. The first to begin
// after n may have read the object before the change; the one that begins
// after a touch that follows it began after the change; and it has ended
// once another begins after a second touch.
func waitNDReconciled(t *testing.T, o *oracle, step string, n int) {
	t.Helper()
	for i := 0; i < 3; i++ {
		if i > 0 {
			n = strings.Count(o.op.Log(), reconcilingNVIDIADriver)
			o.touch(t)
		}
		framework.WaitFor(t, 30*time.Second, fmt.Sprintf("%s: the NVIDIADriver controller to begin reconcile %d after the change", step, i+1),
			func() (bool, string) {
				if !o.op.Running() {
					t.Fatalf("the GPU Operator exited; its log:\n%s", tail(o.op.Log(), 80))
				}
				c := strings.Count(o.op.Log(), reconcilingNVIDIADriver)
				return c > n, fmt.Sprintf("%d %q lines, %d before", c, reconcilingNVIDIADriver, n)
			})
	}
}

// waitNDCollected waits (without failing: the comparison says what stayed)
// for the garbage collector to delete the DaemonSets of the deleted
// NVIDIADriver (uid).
func waitNDCollected(t *testing.T, step, uid string) {
	t.Helper()
	start := time.Now()
	err := framework.Poll(60*time.Second, func() (bool, string) {
		var left []string
		for _, ds := range operatorDaemonSets(t) {
			if slices.ContainsFunc(ds.Metadata.OwnerReferences, func(r ownerReference) bool { return r.UID == uid }) {
				left = append(left, ds.Metadata.Name)
			}
		}
		return len(left) == 0, fmt.Sprintf("DaemonSets owned by the deleted NVIDIADriver: %v", left)
	})
	t.Logf("%s: the deleted NVIDIADriver's DaemonSets collected after %s: %v", step, time.Since(start).Round(time.Millisecond), err)
}

// ndManifest is the NVIDIADriver with the fields the CRD requires and a real
// one has, selecting pool.
func ndManifest(pool string) string {
	return fmt.Sprintf(`{"apiVersion":"nvidia.com/v1alpha1","kind":"NVIDIADriver","metadata":{"name":%q},`+
		`"spec":{"driverType":"gpu","image":"driver","repository":"nvcr.io/nvidia","version":"570.172.08",`+
		`"nodeSelector":{%q:%q}}}`, ndName, ndPoolKey, pool)
}

func ndPatch(pool string) string {
	return fmt.Sprintf(`{"spec":{"nodeSelector":{%q:%q}}}`, ndPoolKey, pool)
}

// ndKubectl is the kubectl command of the step's change (with
// --dry-run=server -o json added, dry): its arguments and standard input.
func ndKubectl(s ndStep, exists, dry bool) ([]string, string) {
	var args []string
	stdin := ""
	switch {
	case s.pool == "":
		args = []string{"delete", "nvidiadriver", ndName, "--timeout=60s"}
	case exists:
		args = []string{"patch", "nvidiadriver", ndName, "--type=merge", "-p", ndPatch(s.pool)}
	default:
		args, stdin = []string{"create", "-f", "-"}, ndManifest(s.pool)
	}
	if dry {
		args = append(args, "--dry-run=server", "-o", "json")
	}
	return args, stdin
}

// predictND writes check-policy's inputs into dir (the live nodes,
// ClusterPolicy, DaemonSets, the other NVIDIADrivers, the NVIDIADriver
// before and after; "" for none) and returns its answer.
func predictND(t *testing.T, o *oracle, dir, old, new string) policyCheck {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	args := []string{"check-policy", "-o", "json",
		"--nodes", write("nodes.json", cp.MustKubectl(t, "get", "nodes", "-o", "json")),
		"--cluster-policy", write("clusterpolicy.json", cp.MustKubectl(t, "get", "clusterpolicy", o.policyName, "-o", "json")),
		"--daemonsets", write("daemonsets.json", cp.MustKubectl(t, "get", "daemonsets", "-n", operatorNS, "-o", "json")),
		"--nvidia-drivers", write("nvidiadrivers.json", cp.MustKubectl(t, "get", "nvidiadrivers", "--field-selector", "metadata.name!="+ndName, "-o", "json")),
		"--operator-version", o.build.Version}
	if old != "" {
		args = append(args, "--old", write("old.json", old))
	}
	if new != "" {
		args = append(args, "--new", write("new.json", new))
	}
	out := runProduct(t, args...)
	var c policyCheck
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("check-policy -o json: %v\n%s", err, out)
	}
	return c
}

// driverShift is the driver's entry of the prediction (none: nowhere).
func driverShift(shifts []shift) shift {
	for _, sh := range shifts {
		if sh.Operand == "driver" {
			return sh
		}
	}
	return shift{Operand: "driver"}
}

// driverView is, per node, the driver DaemonSets that select it by their
// nodeSelector: every DaemonSet of the operator's namespace whose template
// selects the driver's deploy label, named "<owner kind>/<owner>: <name>".
type driverView struct {
	nodes         []string                     // every node, sorted
	byNode        map[string][]string          // node -> the driver DaemonSets selecting it, sorted
	clusterPolicy []string                     // the ClusterPolicy's driver DaemonSets
	nvidiaDriver  map[string]map[string]string // the NVIDIADriver's: name -> nodeSelector
	pods          map[string][]string          // node -> its driver pods ("name phase")
}

// readDrivers reads the driver DaemonSets, the nodes they select and their
// pods, and what is not settled yet: a DaemonSet being deleted, or one the
// DaemonSet controller has not caught up with (observedGeneration, or a
// desiredNumberScheduled other than the nodes its nodeSelector matches).
func readDrivers(t *testing.T) (driverView, string) {
	t.Helper()
	var nodes struct {
		Items []struct {
			Metadata struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "nodes", "-o", "json")), &nodes); err != nil {
		t.Fatal(err)
	}
	v := driverView{byNode: map[string][]string{}, nvidiaDriver: map[string]map[string]string{}, pods: driverPodsByNode(t)}
	for _, n := range nodes.Items {
		v.nodes = append(v.nodes, n.Metadata.Name)
	}
	slices.Sort(v.nodes)
	var pending []string
	for _, ds := range operatorDaemonSets(t) {
		sel := ds.Spec.Template.Spec.NodeSelector
		if sel[driverLabel] != "true" {
			continue
		}
		owner := ds.controller()
		switch {
		case strings.HasPrefix(owner, "ClusterPolicy/"):
			v.clusterPolicy = append(v.clusterPolicy, ds.Metadata.Name)
		case strings.HasPrefix(owner, "NVIDIADriver/"):
			v.nvidiaDriver[ds.Metadata.Name] = sel
		}
		matched := 0
		for _, n := range nodes.Items {
			if matches(sel, n.Metadata.Labels) {
				v.byNode[n.Metadata.Name] = append(v.byNode[n.Metadata.Name], owner+": "+ds.Metadata.Name)
				matched++
			}
		}
		if ds.Metadata.DeletionTimestamp != nil || ds.Status.ObservedGeneration != ds.Metadata.Generation || ds.Status.DesiredNumberScheduled != matched {
			pending = append(pending, fmt.Sprintf("%s (%s): deleting %v, observedGeneration %d of %d, desiredNumberScheduled %d, its nodeSelector %v matches %d nodes",
				ds.Metadata.Name, owner, ds.Metadata.DeletionTimestamp != nil, ds.Status.ObservedGeneration, ds.Metadata.Generation,
				ds.Status.DesiredNumberScheduled, sel, matched))
		}
	}
	for _, l := range v.byNode {
		slices.Sort(l)
	}
	return v, strings.Join(pending, "\n")
}

// driverPodsByNode lists the driver pods ("name phase") by the node they
// are bound to, or, unbound, the node their DaemonSet made them for (the
// DaemonSet controller's node affinity on metadata.name).
func driverPodsByNode(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	lines := cp.MustKubectl(t, "get", "pods", "-n", operatorNS, "-l", driverPods, "-o", `jsonpath={range .items[*]}`+
		`{.metadata.name} {.status.phase} {.spec.nodeName} {.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`+
		`.nodeSelectorTerms[0].matchFields[0].values[0]}{"\n"}{end}`)
	for _, l := range strings.Split(strings.TrimSpace(lines), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 4:
			out[f[2]] = append(out[f[2]], f[0]+" "+f[1])
		case len(f) == 3:
			out[f[2]] = append(out[f[2]], f[0]+" "+f[1]+", unbound")
		}
	}
	return out
}

// runs: a driver DaemonSet selects the node; count: the nodes one selects.
func (v driverView) runs(node string) bool { return len(v.byNode[node]) > 0 }
func (v driverView) count() int            { return len(v.byNode) }

// ndBeforeDiffs compares the prediction's "before" with the driver
// DaemonSets before the change.
func ndBeforeDiffs(sh shift, before driverView) []string {
	var diffs []string
	if sh.Before != before.count() {
		diffs = append(diffs, fmt.Sprintf("check-policy says the driver runs on %d nodes now; driver DaemonSets select %d", sh.Before, before.count()))
	}
	for _, n := range sh.Stops {
		if !before.runs(n) {
			diffs = append(diffs, fmt.Sprintf("node %s: check-policy says the driver stops there; no driver DaemonSet selects it now", n))
		}
	}
	for _, n := range sh.Starts {
		if before.runs(n) {
			diffs = append(diffs, fmt.Sprintf("node %s: check-policy says the driver starts there; driver DaemonSets select it now: %v", n, before.byNode[n]))
		}
	}
	return diffs
}

// ndAfterDiffs compares, node by node, where the prediction says the driver
// runs after the change (where a driver DaemonSet selected it before, less
// stops, plus starts) with the driver DaemonSets that select it after.
func ndAfterDiffs(sh shift, before, after driverView) []string {
	var diffs []string
	for _, n := range after.nodes {
		want := before.runs(n) && !slices.Contains(sh.Stops, n) || slices.Contains(sh.Starts, n)
		if want == after.runs(n) {
			continue
		}
		why := "in neither starts nor stops"
		switch {
		case slices.Contains(sh.Starts, n):
			why = "in starts"
		case slices.Contains(sh.Stops, n):
			why = "in stops"
		}
		diffs = append(diffs, fmt.Sprintf("node %s: check-policy predicted the driver runs there after the change: %v (%s); "+
			"driver DaemonSets selecting it before %v, after %v", n, want, why, before.byNode[n], after.byNode[n]))
	}
	if sh.After != after.count() {
		diffs = append(diffs, fmt.Sprintf("check-policy predicted the driver on %d nodes after the change; driver DaemonSets select %d", sh.After, after.count()))
	}
	return diffs
}

// ndFindingDiffs compares check-policy's findings with what the operator
// did: driver-removed must name exactly the nodes every driver DaemonSet
// left; driver-selected-twice every node a second driver DaemonSet came to
// select (two or more after, a set other than before's), and only nodes two
// select after; nvidia-driver-not-reconciled is given exactly when the
// NVIDIADriver still exists and none of its DaemonSets has its new
// nodeSelector.
func ndFindingDiffs(findings []finding, s ndStep, before, after driverView) []string {
	named := map[string][]string{}
	for _, f := range findings {
		for _, n := range after.nodes {
			if regexp.MustCompile(`(^|[^a-z0-9.-])` + regexp.QuoteMeta(n) + `($|[^a-z0-9.-])`).MatchString(f.Message) {
				named[f.Rule] = append(named[f.Rule], n)
			}
		}
	}
	for r := range named {
		slices.Sort(named[r])
		named[r] = slices.Compact(named[r])
	}
	var diffs, lost, twice, anyTwice []string
	for _, n := range after.nodes {
		if before.runs(n) && !after.runs(n) {
			lost = append(lost, n)
		}
		if len(after.byNode[n]) > 1 {
			anyTwice = append(anyTwice, n)
			if !slices.Equal(after.byNode[n], before.byNode[n]) {
				twice = append(twice, n)
			}
		}
	}
	if got := named["driver-removed"]; !slices.Equal(got, lost) {
		diffs = append(diffs, fmt.Sprintf("driver-removed names nodes %v; every driver DaemonSet left %v", got, lost))
	}
	got := named["driver-selected-twice"]
	for _, n := range twice {
		if !slices.Contains(got, n) {
			diffs = append(diffs, fmt.Sprintf("node %s: a second driver DaemonSet came to select it (%v), driver-selected-twice names %v", n, after.byNode[n], got))
		}
	}
	for _, n := range got {
		if !slices.Contains(anyTwice, n) {
			diffs = append(diffs, fmt.Sprintf("node %s: driver-selected-twice names it; driver DaemonSets selecting it after: %v", n, after.byNode[n]))
		}
	}
	applied, pools := s.pool == "", []string{}
	for name, sel := range after.nvidiaDriver {
		applied = applied || sel[ndPoolKey] == s.pool
		pools = append(pools, name+" selects pool="+sel[ndPoolKey])
	}
	slices.Sort(pools)
	warned := slices.ContainsFunc(findings, func(f finding) bool { return f.Rule == "nvidia-driver-not-reconciled" })
	if warned == applied {
		diffs = append(diffs, fmt.Sprintf("nvidia-driver-not-reconciled given: %v; the operator applied the change (pool=%s, or the delete): %v (%v)",
			warned, s.pool, applied, pools))
	}
	return diffs
}

// cleanUpNVIDIADriverTest deletes the NVIDIADriver and the test's nodes
// (and force-deletes their pods: kwok no longer serves a deleted node and no
// pod GC runs), takes the kernel label off the nodes labelKernels gave it
// to, puts the ClusterPolicy's driver back as the sample has it (off,
// useNvidiaDriverCRD false, auto-upgrade on), and waits until no driver
// DaemonSet is left.
func cleanUpNVIDIADriverTest(t *testing.T, o *oracle, kernelled []string) {
	run := func(args ...string) {
		if stdout, stderr, code := cp.Kubectl(args...); code != 0 {
			t.Errorf("cleanup: kubectl %s: exit %d\n%s\n%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	run("delete", "nvidiadriver", ndName, "--ignore-not-found", "--timeout=60s")
	run("patch", "clusterpolicy", o.policyName, "--type=merge", "-p", `{"spec":{"driver":{"enabled":false,"useNvidiaDriverCRD":false,"upgradePolicy":{"autoUpgrade":true}}}}`)
	for _, n := range ndNodes {
		run("delete", "node", n.name, "--ignore-not-found")
		run("delete", "pods", "-n", operatorNS, "--field-selector", "spec.nodeName="+n.name,
			"--ignore-not-found", "--grace-period=0", "--force", "--timeout=60s")
	}
	for _, n := range kernelled {
		run("label", "node", n, nfdKernelKey+"-")
	}
	o.settle(t)
	if err := framework.Poll(catchUp, func() (bool, string) {
		v, pending := readDrivers(t)
		return len(v.clusterPolicy)+len(v.nvidiaDriver) == 0 && pending == "", fmt.Sprintf("%v %v %s", v.clusterPolicy, v.nvidiaDriver, pending)
	}); err != nil {
		t.Errorf("cleanup: driver DaemonSets are left: %v", err)
	}
}
