package oracle

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// What the real operator did, recorded from runs of the version named. A
// node's expected labels are its gpu.present label and all its deploy
// labels, exactly: a label the operator should have swept fails the test as
// surely as one it should have added.
//
// The sets below are gpuStateLabels of controllers/state_manager.go in that
// version, as the operator applied them (docs/gpu-operator.md).
var (
	// container workload, v25.3.4
	containerSet = []string{
		"driver", "gpu-feature-discovery", "container-toolkit", "device-plugin",
		"dcgm", "dcgm-exporter", "node-status-exporter", "operator-validator",
	}
	// vm-passthrough workload, v25.3.4
	passthroughSet = []string{"sandbox-device-plugin", "sandbox-validator", "vfio-manager", "kata-manager", "cc-manager"}
	// vm-vgpu workload, v25.3.4
	vgpuSet = []string{"sandbox-device-plugin", "vgpu-manager", "vgpu-device-manager", "sandbox-validator", "cc-manager"}
)

// labels builds a label map from "key=value" items; keys without a domain
// are deploy-label suffixes ("dcgm=" is nvidia.com/gpu.deploy.dcgm="").
func labels(items ...string) map[string]string {
	m := map[string]string{}
	for _, it := range items {
		k, v, _ := strings.Cut(it, "=")
		if !strings.Contains(k, "/") {
			k = deployPrefix + k
		}
		m[k] = v
	}
	return m
}

// gpu is a GPU node's operator labels: gpu.present=true, every label of
// set as "true", then the extra items (which may override).
func gpu(set []string, extra ...string) map[string]string {
	m := labels(gpuPresent + "=true")
	for _, op := range set {
		m[deployPrefix+op] = "true"
	}
	maps.Copy(m, labels(extra...))
	return m
}

const (
	nfd        = nfdPCI + "=true"
	nfdKernel  = "feature.node.kubernetes.io/kernel-version.full=5.15.0-1026-nvidia"
	migCapable = "nvidia.com/mig.capable"
	product    = "nvidia.com/gpu.product"
	workload   = "nvidia.com/gpu.workload.config"
)

// step is one change to the cluster and the operator labels every node has
// once the operator has reacted to it.
type step struct {
	name   string
	create map[string]map[string]string // new nodes and their labels
	label  map[string][]string          // node -> kubectl label changes (key=value, key-)
	policy string                       // merged into the ClusterPolicy's spec
	want   map[string]map[string]string // node -> operator labels; nodes not named keep theirs
}

// apply makes the step's change, as the cluster admin.
func (s step) apply(t *testing.T, o *oracle) {
	t.Helper()
	for name, l := range s.create {
		createNode(t, name, l)
	}
	for node, changes := range s.label {
		cp.MustKubectl(t, append([]string{"label", "node", node, "--overwrite"}, changes...)...)
	}
	if s.policy != "" {
		o.patchPolicy(t, s.policy)
	}
}

// TestOperatorLabelsNodes drives the real operator through node creation,
// label changes and ClusterPolicy changes (sandbox workloads off and on,
// the default workload) and compares every node's gpu.present and deploy
// labels with what this version of the operator was seen to do.
func TestOperatorLabelsNodes(t *testing.T) {
	o := setUp(t)
	if o.build.Version != "v25.3.4" {
		t.Fatalf("observations are recorded for GPU Operator v25.3.4 only; this build is %s", o.build.Version)
	}
	deniedBefore, err := o.guard.Counter(reviewsTotal, map[string]string{"decision": "denied"})
	if err != nil {
		t.Fatal(err)
	}
	exemptBefore, err := o.guard.Counter(reviewsTotal, map[string]string{"decision": "exempt"})
	if err != nil {
		t.Fatal(err)
	}

	steps := []step{
		{
			name: "new nodes, sandbox workloads off",
			create: map[string]map[string]string{
				"oracle-plain":           labels(nfd),
				"oracle-mig":             labels(nfd, migCapable+"=true"),
				"oracle-a100":            labels(nfd, product+"=NVIDIA-A100-SXM4-80GB"),
				"oracle-a100-notcapable": labels(nfd, product+"=NVIDIA-A100-SXM4-80GB", migCapable+"=false"),
				"oracle-vgpu-host":       labels(nfd, migCapable+"=true", "nvidia.com/vgpu.host-driver-version=550.90.05"),
				"oracle-user":            labels(nfd, "device-plugin=false", "dcgm=", "nvsm=", "client=true", "mig-manager=false"),
				"oracle-paused": labels(nfd, gpuPresent+"=true", "device-plugin=paused-for-mig-change",
					"gpu-feature-discovery=paused-for-mig-change", "container-toolkit=paused-for-driver-upgrade",
					"dcgm-exporter=foo_paused-for-driver-upgrade"),
				"oracle-gone":        labels(gpuPresent+"=true", "device-plugin=true", "container-toolkit=true", "nvsm=true"),
				"oracle-cpu":         labels("device-plugin=true"),
				"oracle-passthrough": labels(nfd, workload+"=vm-passthrough"),
				"oracle-vgpu":        labels(nfd, workload+"=vm-vgpu", "device-plugin=false"),
				"oracle-bogus":       labels(nfd, workload+"=bogus"),
				"oracle-off":         labels(nfd, "operands=false", "device-plugin=false", "nvsm=true"),
				"oracle-off-with":    labels(nfd),
				"oracle-on-with":     labels(nfd, "operands=false"),
			},
			want: map[string]map[string]string{
				"oracle-plain": gpu(containerSet),
				// mig-manager: nvidia.com/mig.capable=true, or failing that
				// the product name; never with a vGPU host driver.
				"oracle-mig":             gpu(containerSet, "mig-manager=true"),
				"oracle-a100":            gpu(containerSet, "mig-manager=true"),
				"oracle-a100-notcapable": gpu(containerSet),
				"oracle-vgpu-host":       gpu(containerSet),
				// Existing values are kept, whatever they are (an empty
				// one too in v25.3.4); keys outside the sets are left alone.
				"oracle-user": gpu(containerSet, "device-plugin=false", "dcgm=", "nvsm=", "client=true", "mig-manager=false"),
				"oracle-paused": gpu(containerSet, "device-plugin=paused-for-mig-change",
					"gpu-feature-discovery=paused-for-mig-change", "container-toolkit=paused-for-driver-upgrade",
					"dcgm-exporter=foo_paused-for-driver-upgrade"),
				// gpu.present=true without an NFD NVIDIA PCI label: flipped,
				// and the operator's deploy labels deleted (nvsm is not one).
				"oracle-gone": labels(gpuPresent+"=false", "nvsm=true"),
				// No GPU label at all: v25.3.4 does not look at the node.
				"oracle-cpu": labels("device-plugin=true"),
				// Sandbox workloads off: every GPU node gets the container set.
				"oracle-passthrough": gpu(containerSet),
				"oracle-vgpu":        gpu(containerSet, "device-plugin=false"),
				"oracle-bogus":       gpu(containerSet),
				// operands=false: no deploy label of the operator's sets stays.
				"oracle-off":      labels(gpuPresent+"=true", "operands=false", "nvsm=true"),
				"oracle-off-with": gpu(containerSet),
				"oracle-on-with":  labels(gpuPresent+"=true", "operands=false"),
			},
		},
		{
			name: "label changes by a person, sandbox workloads off",
			label: map[string][]string{
				"oracle-plain": {deployPrefix + "gpu-feature-discovery-", deployPrefix + "dcgm-exporter="},
				"oracle-user":  {deployPrefix + "operands=false"},
				"oracle-off":   {deployPrefix + "operands-"},
				"oracle-cpu":   {nfd},
				// operands=false set, and removed, each with another deploy
				// label in the same request: the webhook judges what the pass
				// this starts leaves (the toolkit's label is deleted with the
				// device plugin's; the device plugin stays off), so neither is
				// refused.
				"oracle-off-with": {deployPrefix + "operands=false", deployPrefix + "container-toolkit=false"},
				"oracle-on-with":  {deployPrefix + "operands-", deployPrefix + "device-plugin=false"},
			},
			want: map[string]map[string]string{
				// A removed label comes back as true; an emptied one stays
				// empty in v25.3.4.
				"oracle-plain": gpu(containerSet, "dcgm-exporter="),
				// operands=false deletes the user's =false choices too.
				"oracle-user": labels(gpuPresent+"=true", "operands=false", "nvsm=", "client=true"),
				// Removing operands=false brings every label back as true.
				"oracle-off": gpu(containerSet, "nvsm=true"),
				"oracle-cpu": gpu(containerSet),
				// The pass the flip starts deletes the =false written with it.
				"oracle-off-with": labels(gpuPresent+"=true", "operands=false"),
				// It adds the rest of the set back, and keeps the =false.
				"oracle-on-with": gpu(containerSet, "device-plugin=false"),
			},
		},
		{
			name:   "sandbox workloads on (default workload container)",
			policy: `{"sandboxWorkloads":{"enabled":true}}`,
			want: map[string]map[string]string{
				// Labels outside the node's set are deleted, whatever their
				// value; mig-manager goes on every non-container node.
				"oracle-passthrough": gpu(passthroughSet),
				"oracle-vgpu":        gpu(vgpuSet),
				// An invalid workload falls back to the default workload.
				"oracle-bogus": gpu(containerSet),
			},
		},
		{
			name:   "default workload vm-vgpu",
			policy: `{"sandboxWorkloads":{"defaultWorkload":"vm-vgpu"}}`,
			want: map[string]map[string]string{
				// Nodes without a (valid) workload label now get vm-vgpu:
				// paused, emptied and =false values are swept alike, and
				// the user's own keys stay.
				"oracle-plain":           gpu(vgpuSet),
				"oracle-mig":             gpu(vgpuSet),
				"oracle-a100":            gpu(vgpuSet),
				"oracle-a100-notcapable": gpu(vgpuSet),
				"oracle-vgpu-host":       gpu(vgpuSet),
				"oracle-paused":          gpu(vgpuSet),
				"oracle-off":             gpu(vgpuSet, "nvsm=true"),
				"oracle-cpu":             gpu(vgpuSet),
				"oracle-bogus":           gpu(vgpuSet),
				"oracle-on-with":         gpu(vgpuSet),
			},
		},
		{
			name:  "a node's workload changes from vm-vgpu to vm-passthrough",
			label: map[string][]string{"oracle-vgpu": {workload + "=vm-passthrough"}},
			want: map[string]map[string]string{
				"oracle-vgpu": gpu(passthroughSet),
			},
		},
		{
			name:   "sandbox workloads off again",
			policy: `{"sandboxWorkloads":{"enabled":false}}`,
			want: map[string]map[string]string{
				// Back to the container set, every label true: the earlier
				// =false, empty and paused values are gone for good.
				"oracle-plain":           gpu(containerSet),
				"oracle-mig":             gpu(containerSet, "mig-manager=true"),
				"oracle-a100":            gpu(containerSet, "mig-manager=true"),
				"oracle-a100-notcapable": gpu(containerSet),
				"oracle-vgpu-host":       gpu(containerSet),
				"oracle-paused":          gpu(containerSet),
				"oracle-off":             gpu(containerSet, "nvsm=true"),
				"oracle-cpu":             gpu(containerSet),
				"oracle-bogus":           gpu(containerSet),
				"oracle-passthrough":     gpu(containerSet),
				"oracle-vgpu":            gpu(containerSet),
				"oracle-on-with":         gpu(containerSet),
			},
		},
	}

	want := map[string]map[string]string{}
	work := t.TempDir()
	for i, s := range steps {
		t.Logf("step: %s", s.name)
		// check's input: each node as it is before the step (a new one as
		// created), the step's label changes, the ClusterPolicy after it.
		dir := filepath.Join(work, fmt.Sprintf("step-%d", i))
		inputs := snapshot(t, dir)
		for name, l := range s.create {
			inputs[name] = nodeFile(t, dir, name, l)
		}
		s.apply(t, o)
		took := o.settle(t)
		t.Logf("  the operator's first labelling pass showed %v after the ClusterPolicy changed", took)
		maps.Copy(want, s.want)
		failed := false
		for node, w := range want {
			got := operatorLabels(nodeLabels(t, node))
			if d := labelDiff(w, got); d != "" {
				t.Errorf("after %q, node %s differs from what GPU Operator %s does:\n%s", s.name, node, o.build.Version, d)
				failed = true
			}
		}
		// check predicts, per node, what this version's labelling pass leaves.
		policyFile := filepath.Join(dir, "clusterpolicy.json")
		if err := os.WriteFile(policyFile, []byte(cp.MustKubectl(t, "get", "clusterpolicy", o.policyName, "-o", "json")), 0o644); err != nil {
			t.Fatal(err)
		}
		for node, input := range inputs {
			p := predict(t, input, s.label[node], policyFile, o.build.Version)
			got := operatorLabels(nodeLabels(t, node))
			if d := labelDiff(p.Operator.LabelsAfter, got); d != "" {
				t.Errorf("after %q, node %s differs from what check predicted for GPU Operator %s (want = check, got = the operator):\n%s",
					s.name, node, o.build.Version, d)
				failed = true
			}
		}
		if failed {
			t.FailNow()
		}
	}

	// Removing operands=false while switching the toolkit off is refused:
	// the pass it starts would add device-plugin=true back beside it.
	before := nodeLabels(t, "oracle-off-with")
	stdout, stderr, code := cp.Kubectl("label", "node", "oracle-off-with", "--overwrite", deployPrefix+"operands-", deployPrefix+"container-toolkit=false")
	if code == 0 || !strings.Contains(stderr, "which starts its labelling pass on this same update") {
		t.Fatalf("removing operands=false with the toolkit off: exit %d, want a refusal naming the pass\n%s\n%s", code, stdout, stderr)
	}
	if after := nodeLabels(t, "oracle-off-with"); !maps.Equal(before, after) {
		t.Errorf("the refused request changed oracle-off-with: %v -> %v", before, after)
	}

	// None of the operator's writes was refused or slowed down by the
	// webhook: they reached it (exempt reviews grew), the one refusal above
	// is all that was denied, and the operator never saw an admission error.
	deniedAfter, err := o.guard.Counter(reviewsTotal, map[string]string{"decision": "denied"})
	if err != nil {
		t.Fatal(err)
	}
	exemptAfter, err := o.guard.Counter(reviewsTotal, map[string]string{"decision": "exempt"})
	if err != nil {
		t.Fatal(err)
	}
	if deniedAfter-deniedBefore != 1 {
		t.Errorf("the webhook denied %v requests during the run; want only the one refused above", deniedAfter-deniedBefore)
	}
	if exemptAfter <= exemptBefore {
		t.Errorf("no exempt review during the run (%v before, %v after): the operator's writes did not reach the webhook as its service account", exemptBefore, exemptAfter)
	}
	t.Logf("exempt reviews of the operator's writes: %v", exemptAfter-exemptBefore)
	for _, bad := range []string{"admission webhook", "failed calling webhook", "denied the request"} {
		if strings.Contains(o.op.Log(), bad) {
			t.Errorf("the operator's log mentions %q:\n%s", bad, grepLines(o.op.Log(), bad))
		}
	}
}

func grepLines(s, needle string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, needle) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
