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

	"sigs.k8s.io/yaml"

	"gpu-deploy-guard/tests/e2e/framework"
)

const (
	operatorNS   = "gpu-operator"
	operatorSA   = "system:serviceaccount:gpu-operator:gpu-operator"
	deployPrefix = "nvidia.com/gpu.deploy."
	gpuPresent   = "nvidia.com/gpu.present"
	nfdPCI       = "feature.node.kubernetes.io/pci-10de.present"
	reviewsTotal = "gpu_deploy_guard_admission_reviews_total"
)

// oracle is the running operator with the webhook in front of the API
// server, shared by the tests of this package.
type oracle struct {
	build      framework.OperatorBuild
	op         *framework.Operator
	guard      *framework.Guard
	policyName string
	touches    int
}

var shared *oracle

// setUp starts everything once: the webhook registered as deploy/base ships
// it, the operator's CRDs, its namespace and service account (bound to
// cluster-admin: the operator manages RBAC objects of its own), the sample
// ClusterPolicy of its module, and the operator itself, authenticated with
// that service account's token so that the webhook sees its real identity.
func setUp(t *testing.T) *oracle {
	t.Helper()
	if shared != nil {
		if !shared.op.Running() {
			t.Fatalf("the GPU Operator has exited; its log:\n%s", tail(shared.op.Log(), 60))
		}
		return shared
	}
	build, err := framework.BuildOperator()
	if err != nil {
		t.Fatal(err)
	}
	o := &oracle{build: build}
	o.guard = startGuard(t)

	cp.MustKubectl(t, "apply", "--server-side", "-f", build.CRDDir())
	cp.WaitCRDsServed(t, "clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com")
	cp.MustKubectl(t, "create", "namespace", operatorNS)
	cp.MustKubectl(t, "create", "serviceaccount", "gpu-operator", "-n", operatorNS)
	cp.MustKubectl(t, "create", "clusterrolebinding", "gpu-operator-oracle",
		"--clusterrole=cluster-admin", "--serviceaccount="+operatorNS+":gpu-operator")
	kubeconfig := cp.ServiceAccountKubeconfig(t, "gpu-operator-sa", operatorNS, "gpu-operator",
		[]string{"create", "daemonsets", "-n", operatorNS})

	o.policyName = applySampleClusterPolicy(t, build)

	// One GPU node before the operator starts: the first reconcile has a
	// node to label, and settle() uses it as its witness.
	createNode(t, sentinel, map[string]string{nfdPCI: "true", "nvidia.com/gpu.workload.config": "container"})

	op, err := cp.StartOperator(build, kubeconfig, operatorNS)
	if err != nil {
		t.Fatal(err)
	}
	cp.AddCleanup(op.Stop)
	o.op = op
	framework.WaitFor(t, 60*time.Second, "the operator to label its first GPU node", func() (bool, string) {
		if !op.Running() {
			return true, ""
		}
		l := nodeLabels(t, sentinel)
		return l[gpuPresent] == "true" && l[deployPrefix+"dcgm"] == "true", fmt.Sprintf("labels of %s: %v", sentinel, l)
	})
	if !op.Running() {
		t.Fatalf("the GPU Operator exited during start-up; its log:\n%s", tail(op.Log(), 80))
	}
	shared = o
	return o
}

// startGuard runs `gpu-deploy-guard serve` with deploy/base's configuration
// and registers deploy/base's ValidatingWebhookConfiguration, pointed at it.
func startGuard(t *testing.T) *framework.Guard {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cp.Dir, "gpu-deploy-guard")
	configFile, err := cp.WriteShippedGuardConfig(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	g, err := framework.StartGuard(framework.GuardConfig{
		Bin: framework.RequireProductBinary(t), Dir: dir, LogDir: cp.LogDir, ConfigFile: configFile,
		Env: []string{"KUBECONFIG=" + cp.KubeconfigPath},
	})
	if g != nil {
		cp.AddCleanup(g.Stop)
	}
	if err != nil {
		t.Fatalf("starting gpu-deploy-guard serve: %v", err)
	}
	if err := cp.RegisterGuard(root, g); err != nil {
		t.Fatal(err)
	}
	return g
}

// applySampleClusterPolicy applies config/samples/v1_clusterpolicy.yaml of
// the operator's module with two changes: driver.enabled=false (no driver
// container can run here, as on a host with a pre-installed driver) and its
// null fields dropped (the CRD schema refuses `validator.plugin: null`).
func applySampleClusterPolicy(t *testing.T, b framework.OperatorBuild) string {
	t.Helper()
	data, err := os.ReadFile(b.SampleClusterPolicy())
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	dropNulls(obj)
	spec := obj["spec"].(map[string]any)
	spec["driver"].(map[string]any)["enabled"] = false
	out, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := cp.KubectlWithInput(string(out), "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply the sample ClusterPolicy: exit %d\n%s\n%s", code, stdout, stderr)
	}
	return obj["metadata"].(map[string]any)["name"].(string)
}

func dropNulls(m map[string]any) {
	for k, v := range m {
		switch v := v.(type) {
		case nil:
			delete(m, k)
		case map[string]any:
			dropNulls(v)
		}
	}
}

// sentinel is a GPU node whose dcgm label settle() deletes to see the
// operator's labelling pass put it back.
const sentinel = "oracle-sentinel"

// settle returns once a whole labelling pass that began after the caller's
// changes has finished with every node. A pass relabels all nodes, one after
// the other; a reconcile is forced by a ClusterPolicy spec change (its
// controller reacts to a new generation), not waited for on a timer. Passes
// run one at a time. The pass that first relabels the sentinel may have
// begun before the changes (node events start passes too); the next one
// began after it ended, so after the changes; and when a third relabels the
// sentinel, that second pass has finished with every node. It returns how
// long the first relabelling took to show.
func (o *oracle) settle(t *testing.T) time.Duration {
	t.Helper()
	var first time.Duration
	for i := 0; i < 3; i++ {
		cp.MustKubectl(t, "label", "node", sentinel, deployPrefix+"dcgm-")
		start := time.Now()
		o.touch(t)
		framework.WaitFor(t, 30*time.Second, "the operator to relabel "+sentinel, func() (bool, string) {
			if !o.op.Running() {
				t.Fatalf("the GPU Operator exited; its log:\n%s", tail(o.op.Log(), 80))
			}
			v, ok := nodeLabels(t, sentinel)[deployPrefix+"dcgm"]
			return ok && v == "true", fmt.Sprintf("dcgm label present=%v value=%q", ok, v)
		})
		if i == 0 {
			first = time.Since(start)
		}
	}
	return first
}

// touch changes the ClusterPolicy's spec, so its generation grows, in a
// field no deployed DaemonSet reads: the kata manager's environment (v25.3.4
// puts it only into the kata manager's own DaemonSet, and the kata manager is
// off). A field of every operand's pod template (spec.daemonsets.annotations)
// would roll every operand pod on every node at each touch, three times per
// settle; on a busy machine the DaemonSet controller's throttled deletions
// then fall behind the waits of the tests.
func (o *oracle) touch(t *testing.T) {
	t.Helper()
	o.touches++
	patch := fmt.Sprintf(`{"spec":{"kataManager":{"env":[{"name":"GDG_ORACLE_TOUCH","value":"%d"}]}}}`, o.touches)
	cp.MustKubectl(t, "patch", "clusterpolicy", o.policyName, "--type=merge", "-p", patch)
}

// patchPolicy merges patch into the ClusterPolicy's spec.
func (o *oracle) patchPolicy(t *testing.T, spec string) {
	t.Helper()
	cp.MustKubectl(t, "patch", "clusterpolicy", o.policyName, "--type=merge", "-p", `{"spec":`+spec+`}`)
}

// createNode creates a Node with these labels and one annotation (v25.3.4
// panics on a GPU node without annotations; real nodes always have some).
func createNode(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	node := map[string]any{
		"apiVersion": "v1",
		"kind":       "Node",
		"metadata": map[string]any{
			"name":        name,
			"labels":      labels,
			"annotations": map[string]string{"gpu-deploy-guard.oracle/node": "true"},
		},
	}
	data, err := json.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := cp.KubectlWithInput(string(data), "create", "-f", "-"); code != 0 {
		t.Fatalf("create node %s: exit %d\n%s\n%s", name, code, stdout, stderr)
	}
}

// nodeLabels returns the node's current labels.
func nodeLabels(t *testing.T, node string) map[string]string {
	t.Helper()
	var n struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "node", node, "-o", "json")), &n); err != nil {
		t.Fatal(err)
	}
	return n.Metadata.Labels
}

// operatorLabels is the part of a node's labels the operator's model is
// about: gpu.present and every deploy label.
func operatorLabels(all map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range all {
		if k == gpuPresent || strings.HasPrefix(k, deployPrefix) {
			out[k] = v
		}
	}
	return out
}

// labelDiff describes how got differs from want, one key per line.
func labelDiff(want, got map[string]string) string {
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		w, wok := want[k]
		g, gok := got[k]
		switch {
		case wok && !gok:
			fmt.Fprintf(&b, "  %s: want %q, missing\n", k, w)
		case !wok && gok:
			fmt.Fprintf(&b, "  %s: not wanted, got %q\n", k, g)
		case w != g:
			fmt.Fprintf(&b, "  %s: want %q, got %q\n", k, w, g)
		}
	}
	return b.String()
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
