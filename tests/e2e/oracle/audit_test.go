package oracle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// daemonSet is what the test reads of one of the operator's DaemonSets.
type daemonSet struct {
	Metadata struct {
		Name              string           `json:"name"`
		Generation        int64            `json:"generation"`
		DeletionTimestamp *string          `json:"deletionTimestamp"`
		OwnerReferences   []ownerReference `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Spec struct {
				NodeSelector map[string]string `json:"nodeSelector"`
				Tolerations  []map[string]any  `json:"tolerations"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
	Status struct {
		ObservedGeneration     int64 `json:"observedGeneration"`
		DesiredNumberScheduled int   `json:"desiredNumberScheduled"`
		CurrentNumberScheduled int   `json:"currentNumberScheduled"`
		UpdatedNumberScheduled int   `json:"updatedNumberScheduled"`
		NumberAvailable        int   `json:"numberAvailable"`
		NumberUnavailable      int   `json:"numberUnavailable"`
	} `json:"status"`
}

// ownerReference is what the test reads of an object's owner.
type ownerReference struct {
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
	Controller bool   `json:"controller"`
}

// controller is the DaemonSet's controlling owner ("Kind/name"), "" without one.
func (d daemonSet) controller() string {
	for _, r := range d.Metadata.OwnerReferences {
		if r.Controller {
			return r.Kind + "/" + r.Name
		}
	}
	return ""
}

func operatorDaemonSets(t *testing.T) []daemonSet {
	t.Helper()
	var list struct {
		Items []daemonSet `json:"items"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "daemonsets", "-n", operatorNS, "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// deployOperand is the operand a DaemonSet runs when its nodeSelector is
// exactly one deploy label set to "true"; "" otherwise.
func deployOperand(ds daemonSet) string {
	sel := ds.Spec.Template.Spec.NodeSelector
	if len(sel) != 1 {
		return ""
	}
	for k, v := range sel {
		if strings.HasPrefix(k, deployPrefix) && v == "true" {
			return strings.TrimPrefix(k, deployPrefix)
		}
	}
	return ""
}

// auditReport is the part of `audit -o json` compared here.
type auditReport struct {
	Nodes []struct {
		Name     string `json:"name"`
		Operands []struct {
			Operand  string `json:"operand"`
			Expected bool   `json:"expected"`
		} `json:"operands"`
	} `json:"nodes"`
}

// TestAuditAgreesWithOperatorDaemonSets: the audit over the DaemonSets the
// operator really created from its assets says an operand is expected on as
// many nodes as the DaemonSet controller schedules it on
// (desiredNumberScheduled), and on each node `check` says the same.
func TestAuditAgreesWithOperatorDaemonSets(t *testing.T) {
	o := setUp(t)
	for name, l := range map[string]map[string]string{
		"oracle-audit-mig": labels(nfd, migCapable+"=true"),
		"oracle-audit-mps": labels(nfd, "nvidia.com/mps.capable=true"),
		"oracle-audit-cpu": labels("kubernetes.io/os=linux"),
	} {
		if _, _, code := cp.Kubectl("get", "node", name); code != 0 {
			createNode(t, name, l)
		}
	}
	o.settle(t)
	compareAudit(t, o, "sandbox workloads off")

	// Sandbox workloads on: the operator deploys the sandbox operands its
	// sample ClusterPolicy enables, on vm-passthrough and vm-vgpu nodes. The
	// vGPU manager's image tag needs NFD's kernel label of a vm-vgpu node
	// (TransformVGPUManager); without it the operator stops before the
	// sandbox states.
	// The confidential-computing manager, switched on too, selects
	// nvidia.com/cc.capable=true besides its deploy label in v25.3.4: check,
	// which reads no DaemonSet, runs it on the cc-capable node only.
	for name, l := range map[string]map[string]string{
		"oracle-audit-passthrough": labels(nfd, nfdKernel, workload+"=vm-passthrough"),
		"oracle-audit-cc":          labels(nfd, nfdKernel, workload+"=vm-passthrough", "nvidia.com/cc.capable=true"),
		"oracle-audit-vgpu":        labels(nfd, nfdKernel, workload+"=vm-vgpu"),
	} {
		if _, _, code := cp.Kubectl("get", "node", name); code != 0 {
			createNode(t, name, l)
		}
	}
	o.patchPolicy(t, `{"sandboxWorkloads":{"enabled":true},`+
		`"ccManager":{"enabled":true,"repository":"nvcr.io/nvidia/cloud-native","image":"k8s-cc-manager","version":"v0.1.1"}}`)
	t.Cleanup(func() {
		o.patchPolicy(t, `{"sandboxWorkloads":{"enabled":false},"nodeStatusExporter":{"enabled":false},"ccManager":{"enabled":false}}`)
		o.settle(t)
	})
	o.settle(t)
	compareAudit(t, o, "sandbox workloads on")

	// Evidence beats defaults: with the node status exporter on (off by default), an audit
	// of files that has the DaemonSets but not the ClusterPolicy still expects it wherever
	// the DaemonSet controller schedules it.
	o.patchPolicy(t, `{"nodeStatusExporter":{"enabled":true}}`)
	o.settle(t)
	var nse daemonSet
	framework.WaitFor(t, 60*time.Second, "the node status exporter's DaemonSet to be scheduled", func() (bool, string) {
		for _, ds := range operatorDaemonSets(t) {
			if deployOperand(ds) == "node-status-exporter" && ds.Status.ObservedGeneration == ds.Metadata.Generation && ds.Status.DesiredNumberScheduled > 0 {
				nse = ds
				return true, ""
			}
		}
		return false, "no scheduled nvidia-node-status-exporter yet"
	})
	dir := t.TempDir()
	files := map[string][]string{
		"nodes.json":      {"get", "nodes", "-o", "json"},
		"pods.json":       {"get", "pods", "-n", operatorNS, "-o", "json"},
		"daemonsets.json": {"get", "daemonsets", "-n", operatorNS, "-o", "json"},
	}
	for name, args := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(cp.MustKubectl(t, args...)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	report, out := runAuditArgs(t, "--nodes", filepath.Join(dir, "nodes.json"), "--pods", filepath.Join(dir, "pods.json"),
		"--daemonsets", filepath.Join(dir, "daemonsets.json"))
	expected := 0
	for _, n := range report.Nodes {
		for _, op := range n.Operands {
			if op.Operand == "node-status-exporter" && op.Expected {
				expected++
			}
		}
	}
	if expected != nse.Status.DesiredNumberScheduled {
		t.Errorf("node-status-exporter: the DaemonSet controller schedules it on %d nodes, the audit of files without the ClusterPolicy expects it on %d\n%s",
			nse.Status.DesiredNumberScheduled, expected, out)
	}
}

// compareAudit compares the audit's expectations with the DaemonSet
// controller's desiredNumberScheduled, and check's with the audit's, node by
// node.
func compareAudit(t *testing.T, o *oracle, when string) {
	t.Helper()
	t.Logf("%s:", when)
	// The DaemonSet controller recomputes desiredNumberScheduled some time
	// after a node's labels change (observedGeneration follows only the
	// DaemonSets' specs), so the comparison is repeated until the two agree.
	// A real disagreement stays and fails the test with the last difference.
	var (
		report  auditReport
		stdout  string
		names   []string
		desired map[string]int
	)
	framework.WaitFor(t, catchUp, when+": the audit to expect every operand where the DaemonSet controller schedules it", func() (bool, string) {
		// Per operand, the nodes its DaemonSets select by their whole
		// nodeSelector (a deploy label, and cc.capable or mps.capable for
		// some), once the controller's desiredNumberScheduled agrees.
		selection, pending := selectedSettled(t)
		if pending != "" {
			return false, pending
		}
		sets := operatorDaemonSets(t)
		desired = map[string]int{}
		names = names[:0]
		for _, ds := range sets {
			names = append(names, fmt.Sprintf("%s%v=%d", ds.Metadata.Name, ds.Spec.Template.Spec.NodeSelector, ds.Status.DesiredNumberScheduled))
			for k, v := range ds.Spec.Template.Spec.NodeSelector {
				if strings.HasPrefix(k, deployPrefix) && v == "true" {
					op := strings.TrimPrefix(k, deployPrefix)
					desired[op] = len(selection[op])
				}
			}
		}
		if len(desired) == 0 {
			return false, fmt.Sprintf("%d DaemonSets, none selecting a deploy label", len(sets))
		}
		// The operator runs here as a process, without the Deployment the
		// audit reads its version from: the version is given, as it is to check.
		report, stdout = runAuditArgs(t, "--operator-version", o.build.Version)
		var diff []string
		audited := map[string]bool{}
		for _, n := range report.Nodes {
			audited[n.Name] = true
			for _, op := range n.Operands {
				if _, hasDS := desired[op.Operand]; !hasDS {
					if op.Expected {
						diff = append(diff, fmt.Sprintf("node %s, operand %s: the audit expects it, but the operator created no DaemonSet for it", n.Name, op.Operand))
					}
					continue
				}
				if scheduled := slices.Contains(selection[op.Operand], n.Name); scheduled != op.Expected {
					diff = append(diff, fmt.Sprintf("node %s, operand %s: its DaemonSets select the node: %v; the audit expects it: %v", n.Name, op.Operand, scheduled, op.Expected))
				}
			}
		}
		for op, nodes := range selection {
			for _, n := range nodes {
				if !audited[n] {
					diff = append(diff, fmt.Sprintf("node %s, operand %s: selected by its DaemonSets, but the audit reports no such node", n, op))
				}
			}
		}
		slices.Sort(diff)
		return len(diff) == 0, strings.Join(diff, "\n") + "\naudit -o json:\n" + stdout
	})
	slices.Sort(names)
	t.Logf("the operator's DaemonSets (nodeSelector=desiredNumberScheduled):\n  %s", strings.Join(names, "\n  "))
	perNode := map[string]map[string]bool{}
	for _, n := range report.Nodes {
		perNode[n.Name] = map[string]bool{}
		for _, op := range n.Operands {
			if op.Expected {
				perNode[n.Name][op.Operand] = true
			}
		}
	}

	// check, on each node's labels and the ClusterPolicy, runs what the
	// audit expects.
	dir := t.TempDir()
	policyFile := filepath.Join(dir, "clusterpolicy.json")
	if err := os.WriteFile(policyFile, []byte(cp.MustKubectl(t, "get", "clusterpolicy", o.policyName, "-o", "json")), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range report.Nodes {
		nodeFile := filepath.Join(dir, n.Name+".json")
		if err := os.WriteFile(nodeFile, []byte(cp.MustKubectl(t, "get", "node", n.Name, "-o", "json")), 0o644); err != nil {
			t.Fatal(err)
		}
		out := runCheck(t, "--node", nodeFile, "--cluster-policy", policyFile, "--operator-version", o.build.Version)
		for op, runs := range out.Operands.After {
			if _, hasDS := desired[op]; !hasDS {
				continue // no DaemonSet of the operator: nothing runs, whatever check assumes
			}
			if runs != perNode[n.Name][op] {
				t.Errorf("%s, node %s, operand %s: check says runs=%v, the audit expected=%v", when, n.Name, op, runs, perNode[n.Name][op])
			}
		}
	}
}

// runAuditArgs runs `gpu-deploy-guard audit -o json` with args.
func runAuditArgs(t *testing.T, args ...string) (auditReport, string) {
	t.Helper()
	cmd := exec.Command(framework.RequireProductBinary(t), append([]string{"audit", "-o", "json"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.KubeconfigPath)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	// 1: operands are missing (no kubelet runs the pods); 2 would be an error.
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		t.Fatalf("audit: %v\n%s\n%s", err, out.String(), errb.String())
	}
	var r auditReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("audit -o json: %v\n%s", err, out.String())
	}
	return r, out.String()
}

// checkOutput is the part of `check -o json` compared here.
type checkOutput struct {
	Operands struct {
		After map[string]bool `json:"after"`
	} `json:"operands"`
}

// runCheck runs `gpu-deploy-guard check -o json` with args.
func runCheck(t *testing.T, args ...string) checkOutput {
	t.Helper()
	out := runCheckRaw(t, args...)
	var c checkOutput
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("check -o json: %v\n%s", err, out)
	}
	return c
}

// runCheckRaw runs `gpu-deploy-guard check -o json` with args and returns
// its output; exit 1 (denied) is an answer, not an error.
func runCheckRaw(t *testing.T, args ...string) string {
	t.Helper()
	return runProduct(t, append([]string{"check", "-o", "json"}, args...)...)
}

// runProduct runs gpu-deploy-guard with args and returns its output; exit 1
// (denied) is an answer, not an error.
func runProduct(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(framework.RequireProductBinary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		t.Fatalf("gpu-deploy-guard %v: %v\n%s\n%s", args, err, out.String(), errb.String())
	}
	return out.String()
}
