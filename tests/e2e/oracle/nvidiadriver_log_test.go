package oracle

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
)

// logNDTable logs, for the test's nodes and any other node whose driver
// DaemonSets changed, the driver DaemonSets before and after and the pods.
func logNDTable(t *testing.T, step string, sh shift, before, after driverView) {
	t.Helper()
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tPREDICTED\tDAEMONSETS BEFORE\tDAEMONSETS AFTER\tDRIVER PODS")
	others := 0
	for _, n := range after.nodes {
		own := slices.ContainsFunc(ndNodes, func(x ndNode) bool { return x.name == n })
		if !own && slices.Equal(before.byNode[n], after.byNode[n]) {
			if after.runs(n) {
				others++
			}
			continue
		}
		predicted := fmt.Sprintf("%v", before.runs(n) && !slices.Contains(sh.Stops, n) || slices.Contains(sh.Starts, n))
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n, predicted, strings.Join(before.byNode[n], ", "),
			strings.Join(after.byNode[n], ", "), strings.Join(after.pods[n], ", "))
	}
	w.Flush()
	t.Logf("%s: node, whether check-policy says the driver runs there after the change, the driver DaemonSets selecting it, its driver pods "+
		"(%d other nodes selected as before):\n%s", step, others, b.String())
}
