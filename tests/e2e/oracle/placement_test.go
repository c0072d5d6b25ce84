package oracle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The taints of the placement test. The operator's DaemonSets tolerate
// nvidia.com/gpu:NoSchedule by default (every ClusterPolicy operand asset)
// and, once the test sets spec.daemonsets.tolerations, example.com/maint
// with any effect too; never the other two.
const (
	gpuTaint        = "nvidia.com/gpu=present:NoSchedule"
	xidTaint        = "nvidia.com/gpu-xid-error=79:NoSchedule"
	quarantineTaint = "example.com/quarantine=now:NoExecute"
	maintNoSchedule = "example.com/maint=now:NoSchedule"
	maintNoExecute  = "example.com/maint=now:NoExecute"
	maintToleration = `{"key":"example.com/maint","operator":"Exists"}`
	gpuToleration   = `{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}`

	hostToolkitAnnotation = "gpu-deploy-guard.nvidia.com/toolkit-on-hosts"
)

// The placement states the guard prints (`placement` of `audit -o json` and
// of `check -o json`), and two of this test's own for an operand without
// one: "placed" (selected, nothing stops it) and "not-expected" (its labels
// or the ClusterPolicy do not call for it).
const (
	statePlaced     = "placed"
	stateKept       = "stays-not-recreated"
	stateNotPlaced  = "not-placed"
	stateEvicted    = "evicted"
	stateUnselected = "not-selected"
	stateNone       = "not-expected"
)

// placementNode is one node of the test: its taints from creation, and the
// taint the test adds once its pods run.
type placementNode struct {
	name       string
	taints     []string // at creation: before the operator labels it, so before any pod
	laterTaint string   // added in the third phase, over running pods
}

var placementNodes = []placementNode{
	{name: "oracle-place-plain"},
	{name: "oracle-place-gpu-taint", taints: []string{gpuTaint}},
	{name: "oracle-place-ns-before", taints: []string{xidTaint}},
	{name: "oracle-place-nx-before", taints: []string{quarantineTaint}},
	{name: "oracle-place-maint-ns", taints: []string{maintNoSchedule}},
	{name: "oracle-place-maint-nx", taints: []string{maintNoExecute}},
	{name: "oracle-place-ns-after", laterTaint: xidTaint},
	{name: "oracle-place-nx-after", laterTaint: quarantineTaint},
}

// TestPlacementAgreesWithTheDaemonSetController: node by node and operand by
// operand, where the guard says the DaemonSet controller places, keeps,
// evicts or never places an operand's pod is where the real DaemonSet
// controller (with kube-scheduler binding and kwok running the pods) puts
// the pods of the DaemonSets the real GPU Operator renders. Two predictions
// are held to the pods: `audit` of the live cluster (per operand `expected`
// and `placement`), and offline `check` on the Node and the operator's
// DaemonSets (`placement`); a third, `check` on the Node and the
// ClusterPolicy without the DaemonSets, holds the guard's model of the
// tolerations the operator renders.
//
// Phases: (1) nodes created untainted, tainted with the operator's own
// nvidia.com/gpu:NoSchedule, or tainted with untolerated NoSchedule and
// NoExecute taints before the operator labels them (no pod is ever made
// there); (2) spec.daemonsets.tolerations gains example.com/maint (any
// effect): the operator re-renders every DaemonSet and the maint-tainted
// nodes get their pods; (3) two nodes running their pods are tainted: under
// an untolerated NoSchedule taint the pods stay (the same pods), under an
// untolerated NoExecute taint they go; (4) one kept pod is deleted and is
// never re-created. After each phase the controllers settle (bounded waits),
// every node is given a label change (the DaemonSet controller re-examines a
// node on a label or taint change) and the result must hold 10 s later.
//
// The pods of a node tainted NoExecute are deleted by the DaemonSet
// controller itself (shouldContinueRunning is false there); the framework
// does not run the taint-eviction controller, which would evict them too.
// check reads no pods: for an operand a NoSchedule taint keeps it says
// stays-not-recreated, taking the pod to run as it did when the taint came,
// so against check a kept operand must have exactly the pod it had before
// (none on a node tainted before its pods, none once deleted); the table's
// NOTE column marks where check's word assumes a pod that is not there.
func TestPlacementAgreesWithTheDaemonSetController(t *testing.T) {
	o := setUp(t)
	start := time.Now()
	t.Cleanup(func() { cleanUpPlacement(t, o) })

	// Phase 1: the nodes, some tainted before any pod of theirs exists.
	for _, n := range placementNodes {
		createTaintedNode(t, n.name, labels(nfd), n.taints)
	}
	o.settle(t)
	var prev placementObservation // no pod of these nodes before their taints
	prev = comparePlacement(t, o, 1, "taints before the pods", prev, nil)

	// Phase 2: the ClusterPolicy tolerates example.com/maint. The operator
	// renders the list into every operand DaemonSet (a rollout of each).
	tolerate := `"spec":{"daemonsets":{"tolerations":[` + gpuToleration + `,` + maintToleration + `]}}`
	stdout, stderr, code := cp.Kubectl("patch", "clusterpolicy", o.policyName, "--type=merge", "-p", "{"+tolerate+"}")
	if code != 0 {
		// The change rolls every operand, the toolkit too; no node runs
		// a toolkit pod under an untolerated NoSchedule taint (the
		// ns-before node never got one), so nothing is lost by it.
		t.Errorf("phase 2: the guard refuses spec.daemonsets.tolerations += example.com/maint: exit %d\n%s%s"+
			"the pods of the operator on the test's nodes:\n%s", code, stdout, stderr, podsOnPlacementNodes(t))
		// Go on with the change, said to be the hosts' toolkit, then
		// take the annotation off again (no spec change, no rollout).
		cp.MustKubectl(t, "patch", "clusterpolicy", o.policyName, "--type=merge", "-p",
			`{"metadata":{"annotations":{"`+hostToolkitAnnotation+`":"placement test"}},`+tolerate+`}`)
		cp.MustKubectl(t, "annotate", "clusterpolicy", o.policyName, hostToolkitAnnotation+"-")
	} else {
		t.Logf("spec.daemonsets.tolerations += example.com/maint: allowed: %s%s", stdout, stderr)
	}
	waitTolerations(t, []string{gpuToleration, maintToleration}, nil)
	prev = comparePlacement(t, o, 2, "example.com/maint tolerated", prev, nil)

	// Phase 3: taints over running pods.
	for _, n := range placementNodes {
		if n.laterTaint == "" {
			continue
		}
		stdout, stderr, code := cp.Kubectl("taint", "node", n.name, n.laterTaint)
		if code != 0 {
			t.Fatalf("kubectl taint node %s %s: exit %d\n%s\n%s", n.name, n.laterTaint, code, stdout, stderr)
		}
		t.Logf("kubectl taint node %s %s (allowed):\n%s%s", n.name, n.laterTaint, stdout, stderr)
	}
	evicted := prev.pods["oracle-place-nx-after"]
	prev = comparePlacement(t, o, 3, "taints over running pods", prev, nil)
	logDaemonSetDeletions(t, "oracle-place-nx-after", evicted)

	// Phase 4: a pod kept under the NoSchedule taint is deleted; the
	// controller never creates it again.
	node, op := "oracle-place-ns-after", "dcgm-exporter"
	pod := prev.pods[node][op]
	if pod == nil {
		t.Fatalf("phase 4: no %s pod on %s to delete (phase 3 should have kept it)", op, node)
	}
	cp.MustKubectl(t, "delete", "pod", "-n", operatorNS, pod.name, "--timeout=60s")
	delete(prev.pods[node], op)
	comparePlacement(t, o, 4, "a kept pod deleted", prev, map[string]string{node + "/" + op: "deleted by the test"})
	t.Logf("the placement test took %s (after the operator's set-up)", time.Since(start).Round(time.Second))
}

// createTaintedNode is createNode with spec.taints ("key=value:Effect").
func createTaintedNode(t *testing.T, name string, labels map[string]string, taints []string) {
	t.Helper()
	var spec []map[string]string
	for _, tt := range taints {
		kv, effect, _ := strings.Cut(tt, ":")
		k, v, _ := strings.Cut(kv, "=")
		spec = append(spec, map[string]string{"key": k, "value": v, "effect": effect})
	}
	node := map[string]any{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata": map[string]any{
			"name":        name,
			"labels":      labels,
			"annotations": map[string]string{"gpu-deploy-guard.oracle/node": "true"},
		},
		"spec": map[string]any{"taints": spec},
	}
	data, err := json.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := cp.KubectlWithInput(string(data), "create", "-f", "-"); code != 0 {
		t.Fatalf("create node %s: exit %d\n%s\n%s", name, code, stdout, stderr)
	}
}

// cleanUpPlacement deletes the test's nodes (and force-deletes their pods:
// kwok no longer serves a deleted node and no pod GC runs), then takes the
// example.com/maint toleration out of the ClusterPolicy and waits for the
// operator's DaemonSets to be back on their default tolerations, settled,
// before the next test.
func cleanUpPlacement(t *testing.T, o *oracle) {
	for _, n := range placementNodes {
		if _, stderr, code := cp.Kubectl("delete", "node", n.name, "--ignore-not-found"); code != 0 {
			t.Errorf("cleanup: kubectl delete node %s: exit %d: %s", n.name, code, stderr)
		}
		if _, stderr, code := cp.Kubectl("delete", "pods", "-n", operatorNS, "--field-selector", "spec.nodeName="+n.name,
			"--ignore-not-found", "--grace-period=0", "--force", "--timeout=60s"); code != 0 {
			t.Errorf("cleanup: deleting the pods of %s: exit %d: %s", n.name, code, stderr)
		}
	}
	if stdout, stderr, code := cp.Kubectl("patch", "clusterpolicy", o.policyName, "--type=merge", "-p",
		`{"spec":{"daemonsets":{"tolerations":null}}}`); code != 0 {
		t.Errorf("cleanup: removing spec.daemonsets.tolerations: exit %d\n%s\n%s", code, stdout, stderr)
		return
	}
	waitTolerations(t, []string{gpuToleration}, []string{maintToleration})
}

// operand is the deploy label (set to "true") the DaemonSet's nodeSelector
// holds: the operand it runs. The device plugin's MPS control daemon
// selects the device plugin's label beside mps.capable: its pods count as
// the device plugin's (deployOperand, which wants the label alone, leaves it out).
func (d daemonSet) operand() string {
	for k, v := range d.Spec.Template.Spec.NodeSelector {
		if strings.HasPrefix(k, deployPrefix) && v == "true" {
			return strings.TrimPrefix(k, deployPrefix)
		}
	}
	return ""
}

// placementPod is what the test reads of a pod of the operator's namespace.
type placementPod struct {
	Metadata struct {
		Name              string  `json:"name"`
		UID               string  `json:"uid"`
		DeletionTimestamp *string `json:"deletionTimestamp"`
		OwnerReferences   []struct {
			Kind       string `json:"kind"`
			Name       string `json:"name"`
			Controller bool   `json:"controller"`
		} `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

func (p placementPod) daemonSet() string {
	for _, r := range p.Metadata.OwnerReferences {
		if r.Controller && r.Kind == "DaemonSet" {
			return r.Name
		}
	}
	return ""
}

// readDaemonSetsAndPods reads the operator's DaemonSets and pods as JSON
// (the DaemonSets' text is check's --daemonsets).
func readDaemonSetsAndPods(t *testing.T) (string, []daemonSet, []placementPod) {
	t.Helper()
	dsJSON := cp.MustKubectl(t, "get", "daemonsets", "-n", operatorNS, "-o", "json")
	var sets struct {
		Items []daemonSet `json:"items"`
	}
	if err := json.Unmarshal([]byte(dsJSON), &sets); err != nil {
		t.Fatal(err)
	}
	var pods struct {
		Items []placementPod `json:"items"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "pods", "-n", operatorNS, "-o", "json")), &pods); err != nil {
		t.Fatal(err)
	}
	return dsJSON, sets.Items, pods.Items
}

// daemonSetsSettled: every DaemonSet of the operator has acted on its
// generation and has every pod it wants scheduled, updated and available,
// and no pod of the namespace is being deleted, unbound or not Running.
// (A DaemonSet's status counts the nodes it was last synced for: a node
// whose NoSchedule taint came over a running pod stays counted until the
// DaemonSet syncs for another reason. The comparison reads the pods.)
func daemonSetsSettled(t *testing.T) (bool, string) {
	t.Helper()
	_, sets, pods := readDaemonSetsAndPods(t)
	var pending []string
	for _, d := range sets {
		s := d.Status
		if s.ObservedGeneration != d.Metadata.Generation || s.CurrentNumberScheduled != s.DesiredNumberScheduled ||
			s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled ||
			s.NumberUnavailable != 0 {
			pending = append(pending, fmt.Sprintf("%s: generation %d observed %d, desired %d current %d updated %d available %d unavailable %d",
				d.Metadata.Name, d.Metadata.Generation, s.ObservedGeneration, s.DesiredNumberScheduled,
				s.CurrentNumberScheduled, s.UpdatedNumberScheduled, s.NumberAvailable, s.NumberUnavailable))
		}
	}
	for _, p := range pods {
		if p.daemonSet() == "" {
			continue
		}
		if p.Metadata.DeletionTimestamp != nil || p.Spec.NodeName == "" || p.Status.Phase != "Running" {
			pending = append(pending, fmt.Sprintf("pod %s on %q: phase %s, deleting %v",
				p.Metadata.Name, p.Spec.NodeName, p.Status.Phase, p.Metadata.DeletionTimestamp != nil))
		}
	}
	if len(sets) == 0 {
		pending = append(pending, "no DaemonSet in "+operatorNS)
	}
	return len(pending) == 0, strings.Join(pending, "\n")
}

// waitTolerations waits for every DaemonSet of the operator to carry the
// tolerations of want and none of absent (the operator renders
// spec.daemonsets.tolerations into each ClusterPolicy operand, or the assets'
// nvidia.com/gpu one when the list is empty), and for the rollouts that
// follow to settle.
func waitTolerations(t *testing.T, want, absent []string) {
	t.Helper()
	parse := func(items []string) []string {
		var out []string
		for _, it := range items {
			var m map[string]any
			if err := json.Unmarshal([]byte(it), &m); err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(m)
			out = append(out, string(b))
		}
		return out
	}
	wantN, absentN := parse(want), parse(absent)
	var last []string
	framework.WaitFor(t, catchUp, fmt.Sprintf("the operator to render tolerations %v (and not %v) into every DaemonSet", wantN, absentN), func() (bool, string) {
		_, sets, _ := readDaemonSetsAndPods(t)
		var off []string
		last = last[:0]
		for _, d := range sets {
			var have []string
			for _, tol := range d.Spec.Template.Spec.Tolerations {
				b, _ := json.Marshal(tol)
				have = append(have, string(b))
			}
			last = append(last, fmt.Sprintf("%s: %v", d.Metadata.Name, have))
			for _, w := range wantN {
				if !slices.Contains(have, w) {
					off = append(off, fmt.Sprintf("%s lacks %s: %v", d.Metadata.Name, w, have))
				}
			}
			for _, a := range absentN {
				if slices.Contains(have, a) {
					off = append(off, fmt.Sprintf("%s still has %s", d.Metadata.Name, a))
				}
			}
		}
		return len(off) == 0, strings.Join(off, "\n")
	})
	t.Logf("the operator's DaemonSets' tolerations:\n  %s", strings.Join(last, "\n  "))
	framework.WaitFor(t, catchUp, "the DaemonSets' rollouts to settle", func() (bool, string) { return daemonSetsSettled(t) })
}

// podsOnPlacementNodes lists the operator's pods on the test's nodes.
func podsOnPlacementNodes(t *testing.T) string {
	t.Helper()
	_, _, pods := readDaemonSetsAndPods(t)
	var lines []string
	for _, n := range placementNodes {
		var names []string
		for _, p := range pods {
			if p.Spec.NodeName == n.name {
				names = append(names, p.Metadata.Name+" "+p.Status.Phase)
			}
		}
		lines = append(lines, fmt.Sprintf("  %s: %d pods %v", n.name, len(names), names))
	}
	return strings.Join(lines, "\n") + "\n"
}

// placementObservation is the pods of each operand (by deploy label) on
// each node of the test, and the operands with a DaemonSet.
type placementObservation struct {
	pods     map[string]map[string]*observedPod // node -> operand -> pod
	operands []string
}

type observedPod struct {
	name, uid, phase string
	deleting         bool
	count            int // pods of the operand on the node
}

func (o placementObservation) pod(node, op string) *observedPod {
	if o.pods == nil {
		return nil
	}
	return o.pods[node][op]
}

// auditPlacement is the part of `audit -o json` compared here.
type auditPlacement struct {
	Nodes []struct {
		Name     string `json:"name"`
		Operands []struct {
			Operand   string  `json:"operand"`
			Expected  bool    `json:"expected"`
			Running   bool    `json:"running"`
			Pod       *string `json:"pod"`
			Placement string  `json:"placement"`
		} `json:"operands"`
	} `json:"nodes"`
}

// checkPlacement is the part of `check -o json` compared here.
type checkPlacement struct {
	Operands struct {
		After map[string]bool `json:"after"`
	} `json:"operands"`
	Placement map[string]struct {
		State string `json:"state"`
		Taint string `json:"taint"`
	} `json:"placement"`
}

// state is check's word for op: its placement, else placed where it runs.
func (c checkPlacement) state(op string) (state, taint string) {
	if p, ok := c.Placement[op]; ok {
		return p.State, p.Taint
	}
	if c.Operands.After[op] {
		return statePlaced, ""
	}
	return stateNone, ""
}

// placementRound is one reading of the cluster and the guard's three predictions.
type placementRound struct {
	obs      placementObservation
	audit    map[string]map[string]string // node -> operand -> state (as the audit gives it)
	auditRaw string
	check    map[string]checkPlacement // node -> check --node --daemonsets
	rendered map[string]checkPlacement // node -> check --node --cluster-policy
	taints   map[string][]string
	labels   map[string]map[string]string
	diffs    []string
	notes    map[string]string // node/operand -> why a row agrees as it does
	rows     [][]string
}

// readPlacementRound reads the nodes, the operator's DaemonSets and pods, runs
// the three predictions and compares each with the pods, against prev (the
// pods of the phase before, less those the test deleted).
func readPlacementRound(t *testing.T, o *oracle, dir string, prev placementObservation, deleted map[string]string) placementRound {
	t.Helper()
	r := placementRound{
		audit: map[string]map[string]string{}, check: map[string]checkPlacement{},
		rendered: map[string]checkPlacement{}, taints: map[string][]string{}, notes: map[string]string{},
		labels: map[string]map[string]string{},
	}
	// Nodes first, then the DaemonSets and pods: the same order as the audit.
	var nodes struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "nodes", "-o", "json")), &nodes); err != nil {
		t.Fatal(err)
	}
	nodeFiles := map[string]string{}
	for _, raw := range nodes.Items {
		var n struct {
			Metadata struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				Taints []struct {
					Key    string `json:"key"`
					Value  string `json:"value"`
					Effect string `json:"effect"`
				} `json:"taints"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(raw, &n); err != nil {
			t.Fatal(err)
		}
		if !isPlacementNode(n.Metadata.Name) {
			continue
		}
		r.labels[n.Metadata.Name] = n.Metadata.Labels
		for _, tt := range n.Spec.Taints {
			r.taints[n.Metadata.Name] = append(r.taints[n.Metadata.Name], tt.Key+"="+tt.Value+":"+tt.Effect)
		}
		f := filepath.Join(dir, n.Metadata.Name+".json")
		if err := os.WriteFile(f, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		nodeFiles[n.Metadata.Name] = f
	}
	dsJSON, sets, pods := readDaemonSetsAndPods(t)
	dsFile := filepath.Join(dir, "daemonsets.json")
	if err := os.WriteFile(dsFile, []byte(dsJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(dir, "clusterpolicy.json")
	if err := os.WriteFile(policyFile, []byte(cp.MustKubectl(t, "get", "clusterpolicy", o.policyName, "-o", "json")), 0o644); err != nil {
		t.Fatal(err)
	}

	// The pods, by node and operand.
	operandOf := map[string]string{}
	for _, d := range sets {
		if op := d.operand(); op != "" {
			operandOf[d.Metadata.Name] = op
			if !slices.Contains(r.obs.operands, op) {
				r.obs.operands = append(r.obs.operands, op)
			}
		}
	}
	slices.Sort(r.obs.operands)
	r.obs.pods = map[string]map[string]*observedPod{}
	for _, n := range placementNodes {
		r.obs.pods[n.name] = map[string]*observedPod{}
	}
	for _, p := range pods {
		op, ok := operandOf[p.daemonSet()]
		if !ok || !isPlacementNode(p.Spec.NodeName) {
			continue
		}
		byOp := r.obs.pods[p.Spec.NodeName]
		if have := byOp[op]; have != nil {
			have.count++
			continue
		}
		byOp[op] = &observedPod{name: p.Metadata.Name, uid: p.Metadata.UID, phase: p.Status.Phase,
			deleting: p.Metadata.DeletionTimestamp != nil, count: 1}
	}

	// (a) the audit of the live cluster.
	_, raw := runAuditArgs(t, "--operator-version", o.build.Version)
	r.auditRaw = raw
	var audit auditPlacement
	if err := json.Unmarshal([]byte(raw), &audit); err != nil {
		t.Fatalf("audit -o json: %v\n%s", err, raw)
	}
	auditRunning := map[string]bool{}
	for _, n := range audit.Nodes {
		if !isPlacementNode(n.Name) {
			continue
		}
		r.audit[n.Name] = map[string]string{}
		for _, op := range n.Operands {
			state := op.Placement
			if state == "" {
				state = stateNone
				if op.Expected {
					state = statePlaced
				}
			}
			// expected is the audit's own summary of placement: a kept pod
			// counts, an evicted or never placed one does not.
			if op.Expected != (state == statePlaced || state == stateKept) {
				r.diffs = append(r.diffs, fmt.Sprintf("node %s, operand %s: the audit says expected=%v with placement %q",
					n.Name, op.Operand, op.Expected, op.Placement))
			}
			r.audit[n.Name][op.Operand] = state
			auditRunning[n.Name+"/"+op.Operand] = op.Running
		}
	}

	// (b) check on the Node and the DaemonSets; (c) check on the Node and
	// the ClusterPolicy (the tolerations the guard says the operator renders).
	for name, f := range nodeFiles {
		r.check[name] = runCheckPlacement(t, "--node", f, "--daemonsets", dsFile, "--operator-version", o.build.Version)
		r.rendered[name] = runCheckPlacement(t, "--node", f, "--cluster-policy", policyFile, "--operator-version", o.build.Version)
	}

	// The comparison, node by node and operand by operand.
	for _, n := range placementNodes {
		if _, ok := nodeFiles[n.name]; !ok {
			r.diffs = append(r.diffs, "node "+n.name+" is not in the cluster")
			continue
		}
		if _, ok := r.audit[n.name]; !ok {
			r.diffs = append(r.diffs, "node "+n.name+": the audit does not list it")
		}
		for _, op := range r.obs.operands {
			key := n.name + "/" + op
			got := r.obs.pod(n.name, op)
			before := prev.pod(n.name, op)
			obs := "no pod"
			if got != nil {
				obs = got.phase
				if got.deleting {
					obs += ", deleting"
				}
				if got.count > 1 {
					obs += fmt.Sprintf(", %d pods", got.count)
				}
				if before != nil && before.uid == got.uid {
					obs += ", same pod"
				} else if before != nil {
					obs += ", new pod"
				}
			} else if deleted[key] != "" {
				obs += " (" + deleted[key] + ")"
			}
			auditState, ok := r.audit[n.name][op]
			if !ok {
				auditState = stateNone
			}
			if running := auditRunning[key]; running != (got != nil && got.phase == "Running") {
				r.diffs = append(r.diffs, fmt.Sprintf("node %s, operand %s: the audit says running=%v, the pod: %s", n.name, op, running, obs))
			}
			if d := placementDiff("the audit", auditState, got, before, true); d != "" {
				r.diffs = append(r.diffs, fmt.Sprintf("node %s, operand %s: %s", n.name, op, d))
			}
			checkState, checkTaint := r.check[n.name].state(op)
			if d := placementDiff("check --daemonsets", checkState, got, before, false); d != "" {
				r.diffs = append(r.diffs, fmt.Sprintf("node %s, operand %s: %s", n.name, op, d))
			}
			renderedState, _ := r.rendered[n.name].state(op)
			if d := placementDiff("check --cluster-policy", renderedState, got, before, false); d != "" {
				r.diffs = append(r.diffs, fmt.Sprintf("node %s, operand %s: %s", n.name, op, d))
			}
			if checkState == stateKept && got == nil {
				// check reads no pods: an operand its labels select under a
				// NoSchedule taint is taken to run, as it did when the taint
				// came. Here it never ran, or the test deleted it.
				r.notes[key] = "check takes the kept pod to run (it reads no pods)"
			}
			r.rows = append(r.rows, []string{n.name, op, strings.Join(r.taints[n.name], ","), auditState,
				checkState + taintSuffix(checkTaint), renderedState, obs})
		}
	}
	return r
}

func runCheckPlacement(t *testing.T, args ...string) checkPlacement {
	t.Helper()
	out := runCheckRaw(t, args...)
	var c checkPlacement
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("check -o json: %v\n%s", err, out)
	}
	return c
}

func taintSuffix(taint string) string {
	if taint == "" {
		return ""
	}
	return " (" + taint + ")"
}

func isPlacementNode(name string) bool {
	return slices.ContainsFunc(placementNodes, func(n placementNode) bool { return n.name == name })
}

// placementDiff says how the pod (got; before: the same operand's pod in the
// previous phase) disagrees with a prediction's state, or "". withPods: the
// predictor read the pods (the audit), so a kept operand is
// stays-not-recreated exactly when its pod is there, and not-placed when it
// is not; check reads none, and says stays-not-recreated for every kept
// operand, which holds the pod that ran before, if one did.
func placementDiff(who, state string, got, before *observedPod, withPods bool) string {
	running := got != nil && got.phase == "Running" && !got.deleting && got.count == 1
	describe := func() string {
		if got == nil {
			return "no pod"
		}
		return fmt.Sprintf("pod %s %s (deleting %v, %d pods)", got.name, got.phase, got.deleting, got.count)
	}
	switch state {
	case statePlaced:
		if !running {
			return fmt.Sprintf("%s says placed, the DaemonSet controller left %s", who, describe())
		}
	case stateKept:
		switch {
		case before == nil && got != nil:
			return fmt.Sprintf("%s says %s, and a pod there is new: %s", who, state, describe())
		case before == nil && withPods:
			return fmt.Sprintf("%s says %s, but no pod ran there", who, state)
		case before != nil && !running:
			return fmt.Sprintf("%s says %s, but the pod %s that ran went: %s", who, state, before.name, describe())
		case before != nil && got.uid != before.uid:
			return fmt.Sprintf("%s says %s, but the pod %s was replaced by %s", who, state, before.name, got.name)
		}
	case stateNotPlaced, stateEvicted, stateUnselected, stateNone:
		if got != nil {
			return fmt.Sprintf("%s says %s, the DaemonSet controller left %s", who, state, describe())
		}
	default:
		return fmt.Sprintf("%s gives an unknown placement %q", who, state)
	}
	return ""
}

// placementAgreement bounds the comparison's retries once the DaemonSets
// have settled: the controllers may still be acting on the last change
// (pods created, deleted or started a little later), which took under 2 s
// on two busy cores. A real disagreement waits this long in each phase.
const placementAgreement = time.Minute

// comparePlacement waits for the DaemonSets to settle, then compares the
// guard's predictions with the pods until they agree or placementAgreement
// passes; then it gives every node of the test a
// label change, waits 10 s, settles again and compares once more: that
// result is the phase's, each disagreement an error. It logs the table of
// the last comparison and returns its pods.
func comparePlacement(t *testing.T, o *oracle, step int, title string, prev placementObservation, deleted map[string]string) placementObservation {
	t.Helper()
	phase := fmt.Sprintf("phase %d (%s)", step, title)
	phaseStart := time.Now()
	dir := t.TempDir()
	framework.WaitFor(t, catchUp, phase+": the operator's DaemonSets to settle", func() (bool, string) { return daemonSetsSettled(t) })
	var r placementRound
	deadline := time.Now().Add(placementAgreement)
	for {
		r = readPlacementRound(t, o, dir, prev, deleted)
		if len(r.diffs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if len(r.diffs) != 0 {
		t.Logf("%s: no agreement within %s; the last differences:\n  %s", phase, placementAgreement, strings.Join(r.diffs, "\n  "))
	} else {
		t.Logf("%s: the predictions agree with the pods after %s", phase, time.Since(phaseStart).Round(time.Millisecond))
	}
	// The DaemonSet controller re-examines a node whose labels change: a
	// pod it would create, or delete, there is created or deleted now.
	for _, n := range placementNodes {
		cp.MustKubectl(t, "label", "node", n.name, "--overwrite", "gpu-deploy-guard.oracle/nudge="+fmt.Sprint(step))
	}
	time.Sleep(10 * time.Second)
	framework.WaitFor(t, catchUp, phase+": the DaemonSets to settle after the nodes' label change", func() (bool, string) { return daemonSetsSettled(t) })
	r = readPlacementRound(t, o, dir, prev, deleted)
	for _, d := range r.diffs {
		t.Errorf("%s: %s", phase, d)
	}
	if len(r.diffs) != 0 {
		t.Logf("%s: audit -o json:\n%s", phase, r.auditRaw)
	}
	checkScenario(t, step, phase, r)

	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tOPERAND\tTAINTS\tAUDIT\tCHECK --daemonsets\tCHECK --cluster-policy\tPODS\tNOTE")
	for _, row := range r.rows {
		fmt.Fprintln(w, strings.Join(row, "\t")+"\t"+r.notes[row[0]+"/"+row[1]])
	}
	w.Flush()
	var assumed []string
	for _, row := range r.rows {
		if r.notes[row[0]+"/"+row[1]] != "" {
			assumed = append(assumed, row[0]+"/"+row[1])
		}
	}
	if len(assumed) != 0 {
		t.Logf("%s: check says %s, with no pod there, for %d operands: %s", phase, stateKept, len(assumed), strings.Join(assumed, " "))
	}
	t.Logf("%s (%s): node x operand, predicted and observed:\n%s", phase, time.Since(phaseStart).Round(time.Second), b.String())
	return r.obs
}

// checkScenario holds the audit's states to what the test did to each node,
// so that an agreement is not one on a taint that never came: an operand
// whose deploy label the operator set to "true" is placed, kept (not placed
// where it never ran or was deleted), or evicted as the node's taints and
// the phase's tolerations say; any other is not expected.
func checkScenario(t *testing.T, step int, phase string, r placementRound) {
	t.Helper()
	for _, node := range placementNodes {
		want := statePlaced
		switch node.name {
		case "oracle-place-ns-before":
			want = stateNotPlaced
		case "oracle-place-nx-before":
			want = stateEvicted
		case "oracle-place-maint-ns":
			if step < 2 {
				want = stateNotPlaced
			}
		case "oracle-place-maint-nx":
			if step < 2 {
				want = stateEvicted
			}
		case "oracle-place-ns-after":
			if step >= 3 {
				want = stateKept
			}
		case "oracle-place-nx-after":
			if step >= 3 {
				want = stateEvicted
			}
		}
		for _, op := range r.obs.operands {
			w := want
			switch {
			case r.labels[node.name][deployPrefix+op] != "true":
				w = stateNone
			case step == 4 && node.name == "oracle-place-ns-after" && op == "dcgm-exporter":
				w = stateNotPlaced
			}
			if got := r.audit[node.name][op]; got != w {
				t.Errorf("%s: node %s, operand %s: the scenario makes it %s, the audit says %s (taints %v)",
					phase, node.name, op, w, got, r.taints[node.name])
			}
		}
	}
}

// logDaemonSetDeletions logs who removed the pods (operand -> pod) node ran
// before its NoExecute taint. kube-controller-manager's --controllers lack
// the taint-eviction controller (framework.DefaultControllers), so it is
// the DaemonSet controller that deletes a daemon pod whose node no longer
// lets it run (shouldContinueRunning false); its SuccessfulDelete events
// name the pods, when the event recorder's spam filter (25 events per
// DaemonSet, then one per 5 minutes) has not dropped them after a rollout.
func logDaemonSetDeletions(t *testing.T, node string, pods map[string]*observedPod) {
	t.Helper()
	controllers := "(not found)"
	if pid, ok := cp.Pids()["kube-controller-manager"]; ok {
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			for _, arg := range strings.Split(string(cmdline), "\x00") {
				if strings.HasPrefix(arg, "--controllers=") {
					controllers = arg
				}
			}
		}
	}
	out := cp.MustKubectl(t, "get", "events", "-n", operatorNS, "--field-selector", "reason=SuccessfulDelete",
		"-o", `jsonpath={range .items[*]}{.reportingComponent} {.involvedObject.kind}/{.involvedObject.name}: {.message}{"\n"}{end}`)
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		for _, p := range pods {
			if strings.HasSuffix(l, " "+p.name) {
				lines = append(lines, l)
			}
		}
	}
	t.Logf("the %d pods %s ran before its NoExecute taint are gone; kube-controller-manager %s; SuccessfulDelete events naming them: %d\n  %s",
		len(pods), node, controllers, len(lines), strings.Join(lines, "\n  "))
}
