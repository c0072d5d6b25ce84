package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestCheckPredictsWhereTheDaemonSetControllerRunsEachOperand: the policy
// reasons about "the operands the DaemonSet controller runs on a node with
// these labels". After each label change, what `gpu-deploy-guard check`
// says runs on each node (operands.after, with no change given) must be
// exactly where the real DaemonSet controller places each operand: the
// same nodes, hence the same desiredNumberScheduled.
func TestCheckPredictsWhereTheDaemonSetControllerRunsEachOperand(t *testing.T) {
	setUpLab(t)
	steps := []struct {
		what  string
		node  string
		label []string // kubectl label arguments after the node name
		// Literal expectations from the lab, where it states them.
		want map[string]int
	}{
		{what: "the lab as created", want: map[string]int{"driver": 1, "dcgm-exporter": 2}},
		{what: "lab-node-1 dcgm-exporter=false", node: "lab-node-1",
			label: []string{deployPrefix + "dcgm-exporter=false", "--overwrite"}, want: map[string]int{"dcgm-exporter": 1}},
		{what: "lab-node-0 driver=pre-installed (any value but true means not here)", node: "lab-node-0",
			label: []string{deployPrefix + "driver=pre-installed", "--overwrite"}, want: map[string]int{"driver": 0}},
		{what: "lab-node-0 device-plugin and container-toolkit off together", node: "lab-node-0",
			label: []string{deployPrefix + "device-plugin=false", deployPrefix + "container-toolkit=false", "--overwrite"}},
		{what: "lab-node-2 gets the toolkit and the device plugin", node: "lab-node-2",
			label: []string{deployPrefix + "container-toolkit=true", deployPrefix + "device-plugin=true"}},
		{what: "lab-node-1 gpu-feature-discovery removed", node: "lab-node-1",
			label: []string{deployPrefix + "gpu-feature-discovery-"}},
		{what: "lab-node-0 gpu-feature-discovery paused (not true, so not scheduled)", node: "lab-node-0",
			label: []string{deployPrefix + "gpu-feature-discovery=paused-for-driver-upgrade", "--overwrite"}},
	}
	previous := ""
	for _, step := range steps {
		if step.node != "" {
			got := kubectl(append([]string{"label", "node", step.node}, step.label...)...)
			if got.code != 0 {
				t.Fatalf("%s: kubectl label node %s %s: %s", step.what, step.node, strings.Join(step.label, " "), got)
			}
		}
		// Where check says each lab operand runs.
		placement := map[string][]string{}
		for _, node := range labNodeNames {
			v := predict(t, node)
			for operand := range labDaemonSets {
				runs, ok := v.Operands.After[operand]
				if !ok {
					t.Fatalf("check -o json for %s has no operand %q in operands.after: %v", node, operand, v.Operands.After)
				}
				if runs {
					placement[operand] = append(placement[operand], node)
				}
			}
		}
		for operand, n := range step.want {
			if got := len(placement[operand]); got != n {
				t.Fatalf("%s: check places %s on %d nodes (%v), the lab says %d", step.what, operand, got, placement[operand], n)
			}
		}
		summary := placementSummary(placement)
		if summary == previous {
			t.Fatalf("%s: placement did not change (%s): the step tests nothing", step.what, summary)
		}
		previous = summary
		t.Logf("%s: check says %s", step.what, summary)
		for operand, ds := range labDaemonSets {
			nodes := placement[operand]
			waitDesired(t, ds, fmt.Sprint(len(nodes)))
			waitPodNodes(t, ds, nodes)
		}
	}
}

func placementSummary(p map[string][]string) string {
	var parts []string
	for operand := range labDaemonSets {
		parts = append(parts, fmt.Sprintf("%s=%d%v", operand, len(p[operand]), p[operand]))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
