package oracle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

const policyReviewsTotal = "gpu_deploy_guard_policy_reviews_total"

// shift is one entry of `check-policy -o json`'s operands: where the guard
// predicts an operand runs before and after the change.
type shift struct {
	Operand string   `json:"operand"`
	Before  int      `json:"before"`
	After   int      `json:"after"`
	Starts  []string `json:"starts"`
	Stops   []string `json:"stops"`
}

type policyCheck struct {
	Decision string    `json:"decision"`
	Message  *string   `json:"message"`
	Warnings []string  `json:"warnings"`
	Findings []finding `json:"findings"`
	Operands []shift   `json:"operands"`
}

// finding is one rule's word in `check-policy -o json`.
type finding struct {
	Rule    string `json:"rule"`
	Action  string `json:"action"`
	Message string `json:"message"`
}

// TestPolicyChangesAgreeWithOperator: for ClusterPolicy changes the guard
// allows, what `check-policy` predicts (over the live nodes, the live
// ClusterPolicy before and the server's dry run of the change, and the
// operator's DaemonSets) is what the real operator then does: for every
// operand it has a DaemonSet for, the nodes those DaemonSets select before
// the change are the guard's "before", and after it the guard's "after",
// node by node. A change the guard refuses is refused through kubectl and
// leaves the operator's DaemonSets as they were; nothing else is refused,
// and the operator never meets an admission error.
func TestPolicyChangesAgreeWithOperator(t *testing.T) {
	o := setUp(t)
	if o.build.Version != "v25.3.4" {
		t.Fatalf("the steps are chosen for GPU Operator v25.3.4; this build is %s", o.build.Version)
	}
	for name, l := range map[string]map[string]string{
		"oracle-policy-gpu":  labels(nfd),
		"oracle-policy-mig":  labels(nfd, migCapable+"=true"),
		"oracle-policy-mps":  labels(nfd, "nvidia.com/mps.capable=true"),
		"oracle-policy-user": labels(nfd, "device-plugin=false"),
		"oracle-policy-vm":   labels(nfd, nfdKernel, workload+"=vm-passthrough"),
		"oracle-policy-cpu":  labels("kubernetes.io/os=linux"),
	} {
		if _, _, code := cp.Kubectl("get", "node", name); code != 0 {
			createNode(t, name, l)
		}
	}
	o.settle(t)
	deniedBefore := policyReviews(t, o, "denied")

	steps := []struct{ name, spec string }{
		{"dcgm-exporter off", `{"dcgmExporter":{"enabled":false}}`},
		{"dcgm-exporter on", `{"dcgmExporter":{"enabled":true}}`},
		{"toolkit and device plugin off together", `{"toolkit":{"enabled":false},"devicePlugin":{"enabled":false}}`},
		{"toolkit and device plugin on again", `{"toolkit":{"enabled":true},"devicePlugin":{"enabled":true}}`},
		{"gpu-feature-discovery and mig-manager off", `{"gfd":{"enabled":false},"migManager":{"enabled":false}}`},
		{"gpu-feature-discovery and mig-manager on", `{"gfd":{"enabled":true},"migManager":{"enabled":true}}`},
		{"node status exporter on", `{"nodeStatusExporter":{"enabled":true}}`},
		{"node status exporter off", `{"nodeStatusExporter":{"enabled":false}}`},
		{"sandbox workloads on", `{"sandboxWorkloads":{"enabled":true}}`},
		{"sandbox workloads off", `{"sandboxWorkloads":{"enabled":false}}`},
	}
	t.Cleanup(func() {
		o.patchPolicy(t, `{"sandboxWorkloads":{"enabled":false},"nodeStatusExporter":{"enabled":false},"dcgmExporter":{"enabled":true},`+
			`"toolkit":{"enabled":true},"devicePlugin":{"enabled":true},"gfd":{"enabled":true},"migManager":{"enabled":true}}`)
		o.settle(t)
	})
	work := t.TempDir()
	for i, s := range steps {
		t.Logf("step: %s", s.name)
		dir := filepath.Join(work, fmt.Sprintf("step-%d", i))
		got := predictPolicy(t, o, dir, s.spec)
		if got.Decision != "allowed" {
			t.Fatalf("%s: check-policy says %s: %v", s.name, got.Decision, deref(got.Message))
		}
		for _, w := range got.Warnings {
			t.Logf("  warning: %s", w)
		}
		changed := 0
		for _, sh := range got.Operands {
			if len(sh.Starts)+len(sh.Stops) > 0 {
				t.Logf("  the guard predicts %s on %d -> %d nodes (starts on %v, stops on %v)", sh.Operand, sh.Before, sh.After, sh.Starts, sh.Stops)
				changed++
			}
		}
		if changed == 0 {
			t.Fatalf("%s: the guard predicts no operand starts or stops anywhere; every step here changes some", s.name)
		}
		// Before the change, the operator's DaemonSets select the nodes the
		// guard says each operand runs on now.
		var now map[string][]string
		framework.WaitFor(t, catchUp, s.name+": the DaemonSet controller to catch up before the change", func() (bool, string) {
			var pending string
			now, pending = selectedSettled(t)
			return pending == "", pending
		})
		if d := shiftDiff(got.Operands, now, nil, "before"); d != "" {
			t.Fatalf("%s: before the change, the guard and the operator's DaemonSets disagree:\n%s", s.name, d)
		}

		if stdout, stderr, code := cp.Kubectl("patch", "clusterpolicy", o.policyName, "--type=merge", "-p", `{"spec":`+s.spec+`}`); code != 0 {
			t.Fatalf("%s: kubectl patch: exit %d\n%s\n%s", s.name, code, stdout, stderr)
		}
		o.settle(t)
		// The DaemonSet controller and the operator's deletions follow the
		// labels and the ClusterPolicy some time later: compared until they
		// agree; a real disagreement stays and fails with the last difference.
		framework.WaitFor(t, catchUp, s.name+": the operator's DaemonSets to select what the guard predicted", func() (bool, string) {
			after, pending := selectedSettled(t)
			if pending != "" {
				return false, pending
			}
			d := shiftDiff(got.Operands, after, now, "after")
			return d == "", d
		})
	}

	// The toolkit switched off alone is refused through kubectl, with the
	// guard's message, and the operator keeps the toolkit's DaemonSet.
	beforeDenied := selected(t)
	stdout, stderr, code := cp.Kubectl("patch", "clusterpolicy", o.policyName, "--type=merge", "-p", `{"spec":{"toolkit":{"enabled":false}}}`)
	if code == 0 || !strings.Contains(stderr, "toolkit-switched-off") && !strings.Contains(stderr, "spec.toolkit.enabled true -> false") {
		t.Fatalf("switching the toolkit off alone: exit %d, want a refusal naming the rule\n%s\n%s", code, stdout, stderr)
	}
	o.settle(t)
	if after := selected(t); !slices.Equal(after["container-toolkit"], beforeDenied["container-toolkit"]) || len(after["container-toolkit"]) == 0 {
		t.Errorf("after the refused change the toolkit's DaemonSet selects %v, before it %v", after["container-toolkit"], beforeDenied["container-toolkit"])
	}

	// That was the one refusal; the operator's own writes never met one.
	if d := policyReviews(t, o, "denied") - deniedBefore; d != 1 {
		t.Errorf("the webhook denied %v GPU-policy requests during the run; want exactly the one refused above", d)
	}
	for _, bad := range []string{"admission webhook", "failed calling webhook", "denied the request"} {
		if strings.Contains(o.op.Log(), bad) {
			t.Errorf("the operator's log mentions %q:\n%s", bad, grepLines(o.op.Log(), bad))
		}
	}
}

// catchUp bounds the waits for the operator's DaemonSets and the DaemonSet
// controller to follow a change. Switching sandbox workloads on or off
// replaces the operands of twenty nodes at once: the controller's pod
// creations and deletions are throttled on the client side (its default 20
// requests a second), which took 15-40 s on two busy cores. The waits end as
// soon as the selections agree; only a real disagreement waits this long.
const catchUp = 3 * time.Minute

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// policyReviews is the guard's count of ClusterPolicy reviews with this decision.
func policyReviews(t *testing.T, o *oracle, decision string) float64 {
	t.Helper()
	n, err := o.guard.Counter(policyReviewsTotal, map[string]string{"kind": "ClusterPolicy", "decision": decision})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// predictPolicy writes the live nodes, the operator's DaemonSets, the
// ClusterPolicy and the server's dry run of spec merged into it into dir,
// and returns what `check-policy` says of the change.
func predictPolicy(t *testing.T, o *oracle, dir, spec string) policyCheck {
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
	oldFile := write("old.json", cp.MustKubectl(t, "get", "clusterpolicy", o.policyName, "-o", "json"))
	newFile := write("new.json", cp.MustKubectl(t, "patch", "clusterpolicy", o.policyName, "--type=merge",
		"-p", `{"spec":`+spec+`}`, "--dry-run=server", "-o", "json"))
	nodesFile := write("nodes.json", cp.MustKubectl(t, "get", "nodes", "-o", "json"))
	dsFile := write("daemonsets.json", cp.MustKubectl(t, "get", "daemonsets", "-n", operatorNS, "-o", "json"))
	out := runProduct(t, "check-policy", "-o", "json", "--old", oldFile, "--new", newFile, "--nodes", nodesFile,
		"--daemonsets", dsFile, "--operator-version", o.build.Version)
	var c policyCheck
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("check-policy -o json: %v\n%s", err, out)
	}
	return c
}

// selected is, per operand (the deploy label its DaemonSet selects), the
// sorted nodes the operator's DaemonSets select by their nodeSelector.
func selected(t *testing.T) map[string][]string {
	t.Helper()
	s, _ := selectedSettled(t)
	return s
}

// selectedSettled is selected, and what is not settled yet: a DaemonSet the
// controller has not caught up with, or whose desiredNumberScheduled differs
// from the nodes its selector matches (this test's reading of the DaemonSet
// controller, checked against the real one).
func selectedSettled(t *testing.T) (map[string][]string, string) {
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
	out := map[string][]string{}
	var pending []string
	for _, ds := range operatorDaemonSets(t) {
		sel := ds.Spec.Template.Spec.NodeSelector
		op := ""
		for k, v := range sel {
			if strings.HasPrefix(k, deployPrefix) && v == "true" {
				op = strings.TrimPrefix(k, deployPrefix)
			}
		}
		if op == "" {
			pending = append(pending, fmt.Sprintf("%s selects no deploy label: %v", ds.Metadata.Name, sel))
			continue
		}
		matched := 0
		for _, n := range nodes.Items {
			if matches(sel, n.Metadata.Labels) {
				out[op] = append(out[op], n.Metadata.Name)
				matched++
			}
		}
		if ds.Status.ObservedGeneration != ds.Metadata.Generation || ds.Status.DesiredNumberScheduled != matched {
			pending = append(pending, fmt.Sprintf("%s: observedGeneration %d of %d, desiredNumberScheduled %d, its nodeSelector %v matches %d nodes",
				ds.Metadata.Name, ds.Status.ObservedGeneration, ds.Metadata.Generation, ds.Status.DesiredNumberScheduled, sel, matched))
		}
	}
	// An operand may have several DaemonSets (the device plugin's MPS control
	// daemon selects its deploy label too): it runs where any of them runs.
	for op := range out {
		slices.Sort(out[op])
		out[op] = slices.Compact(out[op])
	}
	return out, strings.Join(pending, "\n")
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if have, ok := labels[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// noDaemonSet are the deploy labels no DaemonSet of v25.3.4 selects: the
// guard's model may say they "run" where labelled; nothing is there to compare.
var noDaemonSet = []string{"nvsm", "client", "dra-driver", "dra-validator", "dcgm-dra", "dcgm-exporter-dra"}

// shiftDiff compares the guard's prediction with the nodes the operator's
// DaemonSets select (live), one line per disagreement.
//
// before: live is the selection before the change; the guard's count of
// nodes each operand runs on must equal it, the nodes it says the operand
// stops on must be among them and those it starts on must not.
//
// after: live is the selection after the change, now the one before it;
// each operand must run exactly on now, without the nodes it stops on, with
// those it starts on, and on as many nodes as the guard counted.
func shiftDiff(shifts []shift, live, now map[string][]string, when string) string {
	by := map[string]shift{}
	ops := map[string]bool{}
	for _, sh := range shifts {
		by[sh.Operand] = sh
		ops[sh.Operand] = true
	}
	for op := range live {
		ops[op] = true
	}
	var diff []string
	for op := range ops {
		if slices.Contains(noDaemonSet, op) {
			continue
		}
		sh := by[op]
		got := live[op]
		switch when {
		case "before":
			if sh.Before != len(got) {
				diff = append(diff, fmt.Sprintf("%s: the guard says it runs on %d nodes now, the operator's DaemonSets select %d %v", op, sh.Before, len(got), got))
			}
			for _, n := range sh.Stops {
				if !slices.Contains(got, n) {
					diff = append(diff, fmt.Sprintf("%s: the guard says it stops on %s, where no DaemonSet of the operator runs it now", op, n))
				}
			}
			for _, n := range sh.Starts {
				if slices.Contains(got, n) {
					diff = append(diff, fmt.Sprintf("%s: the guard says it starts on %s, where it runs already", op, n))
				}
			}
		default:
			want := afterNodes(sh, now[op])
			if !slices.Equal(want, got) || sh.After != len(got) {
				diff = append(diff, fmt.Sprintf("%s: the guard predicted %d nodes %v (starts %v, stops %v), the operator's DaemonSets select %v",
					op, sh.After, want, sh.Starts, sh.Stops, got))
			}
		}
	}
	slices.Sort(diff)
	return strings.Join(diff, "\n")
}

// afterNodes is where the guard says sh runs once the change is applied:
// the nodes it ran on (now), without those it stops on, with those it
// starts on.
func afterNodes(sh shift, now []string) []string {
	out := []string{}
	for _, n := range now {
		if !slices.Contains(sh.Stops, n) {
			out = append(out, n)
		}
	}
	out = append(out, sh.Starts...)
	slices.Sort(out)
	return slices.Compact(out)
}
