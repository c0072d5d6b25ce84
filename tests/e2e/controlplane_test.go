package e2e

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

const (
	labNodes         = "testdata/lab-nodes.yaml"
	operandDaemonSet = "testdata/gpu-operator-daemonsets.yaml"
	operatorNS       = "gpu-operator"
)

// TestControlPlaneSchedulesDaemonSetsByNodeSelector checks the harness
// itself: with kwok in place of kubelets, the DaemonSet controller must
// derive desiredNumberScheduled (and the pods it creates, bound by
// kube-scheduler) from the nodes' nvidia.com/gpu.deploy.* labels, and follow
// a label change. Later tests rely on exactly this to observe what a Node
// label edit would do.
func TestControlPlaneSchedulesDaemonSetsByNodeSelector(t *testing.T) {
	cp.MustKubectl(t, "apply", "-f", labNodes)
	cp.MustKubectl(t, "apply", "-f", operandDaemonSet)
	t.Cleanup(func() {
		for _, f := range []string{operandDaemonSet, labNodes} {
			if _, stderr, code := cp.Kubectl("delete", "-f", f, "--ignore-not-found", "--timeout=60s"); code != 0 {
				t.Errorf("cleanup: kubectl delete -f %s: exit %d: %s", f, code, stderr)
			}
		}
	})

	// Placement must depend on labels alone: no taint may be added to the
	// lab nodes behind the test's back (see framework.Start).
	if taints := strings.TrimSpace(cp.MustKubectl(t, "get", "nodes", "-o", "jsonpath={.items[*].spec.taints}")); taints != "" {
		t.Fatalf("lab nodes are tainted: %s", taints)
	}

	// lab-node-0 has every deploy label "true", lab-node-1 all but the driver,
	// lab-node-2 none.
	want := []struct {
		daemonSet string
		desired   string
		nodes     []string
	}{
		{"nvidia-driver-daemonset", "1", []string{"lab-node-0"}},
		{"nvidia-container-toolkit-daemonset", "2", []string{"lab-node-0", "lab-node-1"}},
		{"nvidia-device-plugin-daemonset", "2", []string{"lab-node-0", "lab-node-1"}},
		{"gpu-feature-discovery", "2", []string{"lab-node-0", "lab-node-1"}},
		{"nvidia-dcgm-exporter", "2", []string{"lab-node-0", "lab-node-1"}},
	}
	for _, w := range want {
		waitDesired(t, w.daemonSet, w.desired)
		waitPodNodes(t, w.daemonSet, w.nodes)
	}

	cp.MustKubectl(t, "label", "node", "lab-node-1", "nvidia.com/gpu.deploy.dcgm-exporter=false", "--overwrite")
	waitDesired(t, "nvidia-dcgm-exporter", "1")
	waitPodNodes(t, "nvidia-dcgm-exporter", []string{"lab-node-0"})

	// The other operands did not move.
	for _, w := range want[:4] {
		got := strings.TrimSpace(cp.MustKubectl(t, "get", "daemonset", w.daemonSet, "-n", operatorNS,
			"-o", "jsonpath={.status.desiredNumberScheduled}"))
		if got != w.desired {
			t.Errorf("%s: desiredNumberScheduled = %s after relabelling dcgm-exporter, want %s", w.daemonSet, got, w.desired)
		}
	}
}

// waitDesired waits until the DaemonSet's status is current (observed
// generation == generation) and says want nodes should run it.
func waitDesired(t *testing.T, name, want string) {
	t.Helper()
	framework.WaitFor(t, 60*time.Second, name+" desiredNumberScheduled="+want, func() (bool, string) {
		stdout, stderr, code := cp.Kubectl("get", "daemonset", name, "-n", operatorNS, "-o",
			"jsonpath={.status.desiredNumberScheduled} {.status.observedGeneration} {.metadata.generation}")
		if code != 0 {
			return false, strings.TrimSpace(stderr)
		}
		f := strings.Fields(stdout)
		if len(f) != 3 {
			return false, "status not set yet: " + stdout
		}
		return f[0] == want && f[1] == f[2], "desired/observedGeneration/generation = " + strings.Join(f, "/")
	})
}

// waitAllDesired is waitDesired for several DaemonSets at once (name ->
// desiredNumberScheduled), with one kubectl per poll.
func waitAllDesired(t *testing.T, want map[string]string) {
	t.Helper()
	names := slices.Sorted(maps.Keys(want))
	framework.WaitFor(t, 60*time.Second, "desiredNumberScheduled of "+strings.Join(names, ", "), func() (bool, string) {
		stdout, stderr, code := cp.Kubectl("get", "daemonsets", "-n", operatorNS, "-o", `jsonpath={range .items[*]}{.metadata.name} `+
			`{.status.desiredNumberScheduled} {.status.observedGeneration} {.metadata.generation}{"\n"}{end}`)
		if code != 0 {
			return false, strings.TrimSpace(stderr)
		}
		got := map[string][]string{}
		for _, line := range strings.Split(stdout, "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				got[f[0]] = f[1:]
			}
		}
		var off []string
		for _, name := range names {
			if f := got[name]; len(f) != 3 || f[0] != want[name] || f[1] != f[2] {
				off = append(off, fmt.Sprintf("%s desired/observedGeneration/generation = %s, want %s", name, strings.Join(f, "/"), want[name]))
			}
		}
		return len(off) == 0, strings.Join(off, "; ")
	})
}

// waitPodNodes waits until the DaemonSet's pods are exactly one per given
// node. kube-scheduler binds each pod to the node the DaemonSet controller
// created it for (spec.nodeName), and kwok completes the deletion of pods
// the controller removes (and runs the pods; this does not wait for that).
func waitPodNodes(t *testing.T, name string, want []string) {
	t.Helper()
	framework.WaitFor(t, 60*time.Second, name+" pods on "+strings.Join(want, ","), func() (bool, string) {
		stdout, stderr, code := cp.Kubectl("get", "pods", "-n", operatorNS, "-l", "app="+name,
			"-o", `jsonpath={range .items[*]}{.spec.nodeName}{"/"}{.metadata.deletionTimestamp}{" "}{end}`)
		if code != 0 {
			return false, strings.TrimSpace(stderr)
		}
		// "node/" for a live bound pod; "/" (unbound) or "node/<time>"
		// (being deleted) never match want.
		got := strings.Fields(stdout)
		slices.Sort(got)
		wantFields := make([]string, len(want))
		for i, n := range want {
			wantFields[i] = n + "/"
		}
		return slices.Equal(got, wantFields), "pods (node/deletionTimestamp): " + strings.Join(got, " ")
	})
}

// TestUnprivilegedUserCannotLabelNodes checks that authorization is real
// (RBAC, not AlwaysAllow) and that KubectlAs/WriteUserKubeconfig work, so
// tests can tell admission denials from authorization denials.
func TestUnprivilegedUserCannotLabelNodes(t *testing.T) {
	cp.MustKubectl(t, "apply", "-f", labNodes)
	t.Cleanup(func() { cp.Kubectl("delete", "-f", labNodes, "--ignore-not-found") })

	kubeconfig, err := cp.WriteUserKubeconfig("lab-intruder", "lab-users")
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, code := cp.KubectlAs(kubeconfig, "", "label", "node", "lab-node-2", "nvidia.com/gpu.deploy.driver=true")
	if code == 0 || !strings.Contains(stderr, "forbidden") {
		t.Fatalf("unprivileged label: exit %d, stderr %q; want a forbidden error", code, stderr)
	}
	if got := cp.MustKubectl(t, "get", "node", "lab-node-2", "-o", `jsonpath={.metadata.labels.nvidia\.com/gpu\.deploy\.driver}`); got != "" {
		t.Fatalf("label was applied despite the error: %q", got)
	}
}
