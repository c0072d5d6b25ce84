package e2e

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

const (
	toolkitDaemonSet = "nvidia-container-toolkit-daemonset"
	pluginDaemonSet  = "nvidia-device-plugin-daemonset"
	maintenanceTaint = "example.com/maintenance=now:NoSchedule"
)

// labPlacement is where the DaemonSet controller runs each operand on the
// lab of testdata/lab-nodes.yaml, untainted.
var labPlacement = map[string][]string{
	"nvidia-driver-daemonset": {"lab-node-0"},
	toolkitDaemonSet:          {"lab-node-0", "lab-node-1"},
	pluginDaemonSet:           {"lab-node-0", "lab-node-1"},
	"gpu-feature-discovery":   {"lab-node-0", "lab-node-1"},
	"nvidia-dcgm-exporter":    {"lab-node-0", "lab-node-1"},
}

// The webhook's warnings for the maintenance taint on lab-node-0: nothing
// breaks at once (a NoSchedule taint keeps running pods), so it is allowed.
const maintenanceTaintWarnings = "Warning: lab-node-0: container-toolkit would never be re-created under taint " +
	maintenanceTaint + " while device-plugin runs\n" +
	"Warning: lab-node-0: driver, device-plugin, gpu-feature-discovery, dcgm-exporter would never be " +
	"re-created under taint " + maintenanceTaint + "\n"

// TestAToolkitRollUnderANoScheduleTaintLeavesTheDevicePluginAlone is the
// failure the guard's taint rules are about, played by the real components:
// kube-scheduler binds the operand pods, kwok runs them, and the DaemonSet
// controller decides from the taints. lab-node-0, which runs every operand,
// is tainted example.com/maintenance=now:NoSchedule (no operand tolerates
// it; a person may, with the webhook's warning). Then the GPU Operator rolls
// the container toolkit DaemonSet (a new env var in its pod template, as its
// service account; the webhook does not judge DaemonSets, so the roll
// happens behind the guard's back). The controller deletes the toolkit pod
// of lab-node-0 and never creates the new one there, while the device
// plugin there keeps running; on the untainted lab-node-1 the new toolkit
// pod is created and runs. `gpu-deploy-guard audit` then reports
// device-plugin-without-toolkit on lab-node-0.
func TestAToolkitRollUnderANoScheduleTaintLeavesTheDevicePluginAlone(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() { restoreLab(t) })
	freshOperandPods(t, labPlacement)
	before := operandPods(t)
	t.Logf("operand pods before: %v", before)
	audit := func(args ...string) result {
		t.Helper()
		return product(t, []string{"KUBECONFIG=" + cp.KubeconfigPath}, append([]string{"audit"}, args...)...)
	}
	expectResult(t, "before the taint: audit --node lab-node-0 --order-check",
		audit("--node", "lab-node-0", "--order-check"), 0, "ok\n", auditNoClusterPolicyCRD)

	// 1. A person taints lab-node-0 for maintenance.
	expectResult(t, "kubectl taint node lab-node-0 "+maintenanceTaint,
		kubectl("taint", "node", "lab-node-0", maintenanceTaint), 0, "node/lab-node-0 tainted\n", maintenanceTaintWarnings)
	t.Cleanup(func() {
		if got := kubectl("taint", "node", "lab-node-0", "example.com/maintenance-"); got.code != 0 {
			t.Errorf("cleanup: kubectl taint node lab-node-0 example.com/maintenance-: %s", got)
		}
	})
	// The controller keeps what runs there. (It does not even re-sync the
	// DaemonSets for this taint: a NoSchedule taint on a node whose pod may
	// continue running changes nothing it acts on, so their status still
	// counts lab-node-0 until something else makes them sync.)
	if got := operandPods(t); !slices.Equal(got, before) {
		t.Fatalf("operand pods changed under a NoSchedule taint:\nbefore %v\nafter  %v", before, got)
	}
	// The audit: every operand runs, each held only by the taint.
	placement := func(toolkit string) string {
		return "lab-node-0 PLACEMENT driver stays-not-recreated\n" +
			"lab-node-0 PLACEMENT container-toolkit " + toolkit + "\n" +
			"lab-node-0 PLACEMENT device-plugin stays-not-recreated\n" +
			"lab-node-0 PLACEMENT gpu-feature-discovery stays-not-recreated\n" +
			"lab-node-0 PLACEMENT dcgm-exporter stays-not-recreated\n"
	}
	expectResult(t, "tainted, before the roll: audit", audit(), 0,
		"lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\n"+placement("stays-not-recreated"), auditNoClusterPolicyCRD)
	expectResult(t, "tainted, before the roll: audit --node lab-node-0 --order-check",
		audit("--node", "lab-node-0", "--order-check"), 0, "ok\n", auditNoClusterPolicyCRD)

	// 2. The operator rolls the toolkit: its service account may patch the
	// operand DaemonSets (as the real operator's ClusterRole allows).
	cp.MustKubectl(t, "create", "role", "gpu-operator-daemonsets", "-n", operatorNS,
		"--verb=get,patch", "--resource=daemonsets.apps")
	cp.MustKubectl(t, "create", "rolebinding", "gpu-operator-daemonsets", "-n", operatorNS,
		"--role=gpu-operator-daemonsets", "--serviceaccount="+operatorNS+":gpu-operator")
	t.Cleanup(func() {
		if got := kubectl("delete", "rolebinding,role", "gpu-operator-daemonsets", "-n", operatorNS); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	t.Cleanup(func() {
		// kubectl apply (resetLab) keeps a field its last applied
		// configuration never had: remove the env var.
		if got := kubectl("patch", "daemonset", toolkitDaemonSet, "-n", operatorNS, "--type=json",
			"-p", `[{"op":"remove","path":"/spec/template/spec/containers/0/env"}]`); got.code != 0 {
			t.Errorf("cleanup: removing the toolkit's env: %s", got)
		}
	})
	roll := `{"spec":{"template":{"spec":{"containers":[{"name":"container-toolkit","env":[{"name":"CDI_ENABLED","value":"true"}]}]}}}}`
	expectResult(t, "kubectl patch daemonset "+toolkitDaemonSet+" (new env) --as="+operatorSA,
		kubectlAsOperator("patch", "daemonset", toolkitDaemonSet, "-n", operatorNS, "--type=strategic", "-p", roll),
		0, "daemonset.apps/"+toolkitDaemonSet+" patched\n", "")

	// The roll completes: one node wants the toolkit (lab-node-1), and its
	// one pod there is of the new template and available.
	framework.WaitFor(t, 60*time.Second, "the toolkit's roll to complete", func() (bool, string) {
		got := kubectl("get", "daemonset", toolkitDaemonSet, "-n", operatorNS, "-o", "jsonpath={.metadata.generation} "+
			"{.status.observedGeneration} {.status.desiredNumberScheduled} {.status.currentNumberScheduled} "+
			"{.status.updatedNumberScheduled} {.status.numberAvailable} {.status.numberMisscheduled}")
		f := strings.Fields(got.stdout)
		return got.code == 0 && len(f) == 7 && f[0] == f[1] && strings.Join(f[2:], " ") == "1 1 1 1 0",
			"generation observed desired current updated available misscheduled: " + got.stdout
	})
	rolled := rolledPods(t, before)
	// On lab-node-1 (untainted): a new toolkit pod, with the new env, Running.
	newToolkit1 := rolled[toolkitDaemonSet+"@lab-node-1"]
	// On lab-node-0: no toolkit pod, and none comes back. A Node update
	// makes the DaemonSet controller look at the node again (it creates the
	// pod of any DaemonSet that should run there and has none): an
	// unrelated label, then a bounded wait.
	const hold = 15 * time.Second
	cp.MustKubectl(t, "label", "node", "lab-node-0", "example.com/nudge=1")
	t.Cleanup(func() { cp.Kubectl("label", "node", "lab-node-0", "example.com/nudge-") })
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		if got := toolkitPodsOn(t, "lab-node-0"); len(got) != 0 {
			t.Fatalf("a toolkit pod came back on the tainted lab-node-0: %v", got)
		}
		time.Sleep(framework.PollInterval)
	}
	if got := rolledPods(t, before); !maps.Equal(got, rolled) {
		t.Fatalf("operand pods moved during the %s hold:\nbefore %v\nafter  %v", hold, rolled, got)
	}
	t.Logf("the toolkit on lab-node-1 was rolled to %s; lab-node-0 kept its device plugin %s and has no toolkit",
		newToolkit1, podOf(t, pluginDaemonSet, "lab-node-0").name)

	// 3. The audit names lab-node-0: its device plugin runs without a toolkit.
	plugin0 := podOf(t, pluginDaemonSet, "lab-node-0").name
	expectResult(t, "after the roll: audit --node lab-node-0 --order-check",
		audit("--node", "lab-node-0", "--order-check"), 1, "device-plugin-without-toolkit\n", auditNoClusterPolicyCRD)
	// No toolkit is expected on lab-node-0 any more (the taint keeps a new
	// pod off: not MISSING), but the device plugin runs there without one.
	expectResult(t, "after the roll: audit", audit(), 1,
		"lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\nlab-node-0 device-plugin-without-toolkit\n"+placement("not-placed"),
		auditNoClusterPolicyCRD)
	var report struct {
		Nodes []struct {
			Name     string `json:"name"`
			OK       bool   `json:"ok"`
			Findings []struct {
				Rule    string `json:"rule"`
				Level   string `json:"level"`
				Basis   string `json:"basis"`
				Message string `json:"message"`
			} `json:"findings"`
		} `json:"nodes"`
	}
	js := audit("-o", "json")
	if js.code != 1 {
		t.Fatalf("after the roll: audit -o json: want exit 1\n%s", js)
	}
	if err := json.Unmarshal([]byte(js.stdout), &report); err != nil {
		t.Fatalf("audit -o json: %v\n%s", err, js.stdout)
	}
	var found []string
	for _, n := range report.Nodes {
		for _, f := range n.Findings {
			if f.Rule == "device-plugin-without-toolkit" {
				found = append(found, n.Name+" "+f.Level+" "+f.Basis+": "+f.Message)
			}
		}
	}
	wantFinding := "lab-node-0 fail pods: node lab-node-0 runs the NVIDIA device plugin (pod " + plugin0 +
		") but no container toolkit pod runs there, so GPU pods scheduled there fail to start; " +
		"set nvidia.com/gpu.deploy.container-toolkit=true or nvidia.com/gpu.deploy.device-plugin=false."
	if !slices.Equal(found, []string{wantFinding}) {
		t.Errorf("audit -o json: device-plugin-without-toolkit findings\n%q\nwant\n%q", found, []string{wantFinding})
	}
}

// toolkitPodsOn lists the toolkit pods bound to node, live or being deleted.
func toolkitPodsOn(t *testing.T, node string) []string {
	t.Helper()
	out := cp.MustKubectl(t, "get", "pods", "-n", operatorNS, "-l", "app="+toolkitDaemonSet,
		"--field-selector=spec.nodeName="+node, "-o", "name")
	return strings.Fields(out)
}

// rolledPods checks the operand pods against before (operandPods, taken
// before the taint) once the toolkit has rolled, and returns them by
// "<DaemonSet>@<node>": every pod but the toolkit's is the same pod, Running;
// lab-node-0 has no toolkit pod; lab-node-1's toolkit pod is a new one, of
// the new template (CDI_ENABLED), Running.
func rolledPods(t *testing.T, before []labPod) map[string]string {
	t.Helper()
	now := map[string]labPod{}
	for _, p := range operandPods(t) {
		if _, dup := now[p.key()]; dup {
			t.Fatalf("two live pods of %s", p.key())
		}
		now[p.key()] = p
	}
	out := map[string]string{}
	for _, b := range before {
		p, ok := now[b.key()]
		switch {
		case b.key() == toolkitDaemonSet+"@lab-node-0":
			if ok {
				t.Fatalf("the toolkit still has a pod on the tainted lab-node-0 after its roll: %+v", p)
			}
			continue
		case !ok:
			t.Fatalf("no pod of %s after the toolkit's roll", b.key())
		case p.phase != "Running":
			t.Fatalf("%s: pod %s is %s, want Running", b.key(), p.name, p.phase)
		case b.daemonSet == toolkitDaemonSet:
			if p.name == b.name {
				t.Fatalf("%s: pod %s was not replaced by the roll", b.key(), p.name)
			}
			env := cp.MustKubectl(t, "get", "pod", p.name, "-n", operatorNS,
				"-o", `jsonpath={.spec.containers[0].env[?(@.name=="CDI_ENABLED")].value}`)
			if env != "true" {
				t.Fatalf("%s: new pod %s has CDI_ENABLED=%q, want the rolled template's \"true\"", b.key(), p.name, env)
			}
		case p.name != b.name:
			t.Fatalf("%s: pod %s replaced by %s, want it left alone", b.key(), b.name, p.name)
		}
		out[b.key()] = p.name
		delete(now, b.key())
	}
	if len(now) != 0 {
		t.Fatalf("pods the lab did not run before: %v", now)
	}
	return out
}
