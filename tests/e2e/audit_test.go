package e2e

import (
	"encoding/json"
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

// The lab's incident: lab-node-2 (no GPU) with only the device plugin on.
// The webhook refuses this to people, so the tests that need the state set
// it as the GPU Operator's service account, which is exempt.
const labNode2PluginOnly = deployPrefix + "device-plugin=true"

// What `audit` says on stderr when it reads a cluster that has no
// ClusterPolicy CRD, as the lab's cluster does.
const auditNoClusterPolicyCRD = "warning: ClusterPolicy unavailable (the ClusterPolicy CRD (clusterpolicies.nvidia.com) " +
	"is not installed): the GPU Operator's default operand switches are assumed\n"

// labPod is one operand pod of the lab, bound to a node.
type labPod struct{ daemonSet, node, name, phase string }

func (p labPod) key() string { return p.daemonSet + "@" + p.node }

// setUpIncidentLab is setUpLab plus the lab's incident (device-plugin=true
// on lab-node-2, set by the operator's service account), with fresh operand
// pods bound to their nodes by kube-scheduler and Running (kwok), except the
// pods named in pending ("<DaemonSet>@<node>"), which are then reported
// Pending through the API. When the test ends the nodes get their testdata
// labels back and the pods are replaced by fresh ones, so no other test sees
// a pod this test set Pending.
func setUpIncidentLab(t *testing.T, pending ...string) *framework.Guard {
	t.Helper()
	g := setUpLab(t)
	t.Cleanup(func() { restoreLab(t) })
	got := kubectlAsOperator("label", "node", "lab-node-2", labNode2PluginOnly)
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --as="+operatorSA, got, 0, "node/lab-node-2 labeled\n", "")
	placement := map[string][]string{
		"nvidia-driver-daemonset":            {"lab-node-0"},
		"nvidia-container-toolkit-daemonset": {"lab-node-0", "lab-node-1"},
		"nvidia-device-plugin-daemonset":     {"lab-node-0", "lab-node-1", "lab-node-2"},
		"gpu-feature-discovery":              {"lab-node-0", "lab-node-1"},
		"nvidia-dcgm-exporter":               {"lab-node-0", "lab-node-1"},
	}
	freshOperandPods(t, placement)
	for _, p := range operandPods(t) {
		if slices.Contains(pending, p.key()) {
			setPodPhase(t, p.name, "Pending")
		}
	}
	var phases []string
	for _, p := range operandPods(t) {
		phases = append(phases, p.key()+"="+p.phase)
	}
	t.Logf("operand pods: %s", strings.Join(phases, " "))
	return g
}

// freshOperandPods deletes every pod of the operator namespace and waits
// until the DaemonSet controller has made new ones, bound (by kube-scheduler)
// to exactly the nodes in placement and Running (kwok), whatever an earlier
// test did to the old ones.
func freshOperandPods(t *testing.T, placement map[string][]string) {
	t.Helper()
	cp.MustKubectl(t, "delete", "pods", "-n", operatorNS, "--all", "--wait=true", "--timeout=60s")
	for ds, nodes := range placement {
		waitDesired(t, ds, fmt.Sprint(len(nodes)))
		waitPodNodes(t, ds, nodes)
	}
	framework.WaitFor(t, 60*time.Second, "every operand pod Running", func() (bool, string) {
		var phases []string
		running := true
		for _, p := range operandPods(t) {
			phases = append(phases, p.key()+"="+p.phase)
			running = running && p.phase == "Running"
		}
		return running, strings.Join(phases, " ")
	})
}

// reportPending waits until kwok has started the DaemonSet's pod on node,
// then reports that pod Pending, as its kubelet would while the image is
// still being pulled, and returns its name. kwok leaves a started pod's
// status alone, so it stays Pending until the test says otherwise.
func reportPending(t *testing.T, daemonSet, node string) string {
	t.Helper()
	var name string
	framework.WaitFor(t, 60*time.Second, daemonSet+" on "+node+" Running", func() (bool, string) {
		for _, p := range operandPods(t) {
			if p.daemonSet == daemonSet && p.node == node {
				name = p.name
				return p.phase == "Running", p.name + " " + p.phase
			}
		}
		return false, "no pod"
	})
	setPodPhase(t, name, "Pending")
	return name
}

// operandPods lists the pods of the operator namespace that are bound to a
// node and not being deleted.
func operandPods(t *testing.T) []labPod {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string            `json:"name"`
				Labels            map[string]string `json:"labels"`
				DeletionTimestamp *string           `json:"deletionTimestamp"`
			} `json:"metadata"`
			Spec struct {
				NodeName string `json:"nodeName"`
			} `json:"spec"`
			Status struct {
				Phase string `json:"phase"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(cp.MustKubectl(t, "get", "pods", "-n", operatorNS, "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	var out []labPod
	for _, p := range list.Items {
		if p.Spec.NodeName == "" || p.Metadata.DeletionTimestamp != nil {
			continue
		}
		out = append(out, labPod{p.Metadata.Labels["app"], p.Spec.NodeName, p.Metadata.Name, p.Status.Phase})
	}
	slices.SortFunc(out, func(a, b labPod) int { return strings.Compare(a.key(), b.key()) })
	return out
}

// podOf returns the one live pod of the DaemonSet on the node.
func podOf(t *testing.T, daemonSet, node string) labPod {
	t.Helper()
	var found []labPod
	for _, p := range operandPods(t) {
		if p.daemonSet == daemonSet && p.node == node {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one pod of %s on %s, found %v", daemonSet, node, found)
	}
	return found[0]
}

// setPodPhase writes the pod's status.phase through the API, the way a
// kubelet reports it. kwok starts a pod once (see framework/scheduling.go)
// and then leaves its status alone, so the phase stays what the test wrote.
// The DaemonSet controller leaves a pod of either phase alone.
func setPodPhase(t *testing.T, pod, phase string) {
	t.Helper()
	patch := fmt.Sprintf(`{"status":{"phase":%q}}`, phase)
	got := kubectl("patch", "pod", pod, "-n", operatorNS, "--subresource=status", "--type=merge", "-p", patch)
	expectResult(t, "kubectl patch pod "+pod+" --subresource=status phase="+phase, got, 0, "pod/"+pod+" patched\n", "")
}

// restoreLab gives the lab nodes exactly their testdata labels back and
// replaces every operator pod by a fresh one (Running, as kwok starts it).
func restoreLab(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(labNodes)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := framework.SplitManifests(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if got := kubectlWithInput(string(n.YAML), "replace", "-f", "-"); got.code != 0 {
			t.Errorf("cleanup: kubectl replace node %s: %s", n.Name, got)
		}
	}
	if got := kubectl("delete", "pods", "-n", operatorNS, "--all", "--wait=true", "--timeout=60s"); got.code != 0 {
		t.Errorf("cleanup: deleting the operator's pods: %s", got)
	}
}

func kubectlWithInput(stdin string, args ...string) result {
	stdout, stderr, code := cp.KubectlWithInput(stdin, args...)
	return result{stdout, stderr, code}
}

// product runs the gpu-deploy-guard binary with extra environment variables.
func product(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(framework.RequireProductBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if exitErr, ok := err.(*exec.ExitError); ok {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("gpu-deploy-guard %s: %v", strings.Join(args, " "), err)
	}
	return result{stdout.String(), stderr.String(), code}
}

// TestAuditFromTheClusterMatchesTheLab is the lab's hand-written checks,
// done by `gpu-deploy-guard audit` against the API server: the five operand
// DaemonSets, their pods bound to the lab nodes and set Running through the
// API, and lab-node-2 running the device plugin without the toolkit. First
// two pods are left Pending (the lab's MISSING lines), then they run too.
// Every answer is compared with the lab's expected text and exit code, and
// with the same audit made from `kubectl get -o json` files: reading the
// cluster and reading files must give the same audit.
func TestAuditFromTheClusterMatchesTheLab(t *testing.T) {
	setUpIncidentLab(t, "nvidia-dcgm-exporter@lab-node-0", "gpu-feature-discovery@lab-node-1")
	env := []string{"KUBECONFIG=" + cp.KubeconfigPath}

	type want struct {
		args   []string
		stdout string
		code   int
	}
	gaps := []want{
		{nil, "lab-node-0 MISSING dcgm-exporter\n" +
			"lab-node-1 MISSING gpu-feature-discovery\n" +
			"lab-node-2 OK\n" +
			"lab-node-2 device-plugin-without-toolkit\n", 1},
		{[]string{"-o", "matrix"}, "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=no\n" +
			"lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=no dcgm=yes\n" +
			"lab-node-2 driver=no toolkit=no device-plugin=yes gfd=no dcgm=no\n" +
			"TOTAL_PODS=8\n", 1},
		{[]string{"--node", "lab-node-0"}, "lab-node-0 MISSING dcgm-exporter\n", 1},
		{[]string{"--node", "lab-node-2", "--order-check"}, "device-plugin-without-toolkit\n", 1},
		// A node with a gap but a sound pairing passes the order check.
		{[]string{"--node", "lab-node-1", "--order-check"}, "ok\n", 0},
	}
	allRunning := []want{
		{nil, "lab-node-0 OK\nlab-node-1 OK\nlab-node-2 OK\nlab-node-2 device-plugin-without-toolkit\n", 1},
		{[]string{"-o", "matrix"}, "lab-node-0 driver=yes toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n" +
			"lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=yes dcgm=yes\n" +
			"lab-node-2 driver=no toolkit=no device-plugin=yes gfd=no dcgm=no\n" +
			"TOTAL_PODS=10\n", 1},
		{[]string{"--node", "lab-node-0"}, "lab-node-0 OK\n", 0},
		{[]string{"--node", "lab-node-1", "-o", "matrix"},
			"lab-node-1 driver=no toolkit=yes device-plugin=yes gfd=yes dcgm=yes\nTOTAL_PODS=10\n", 0},
		{[]string{"--node", "lab-node-2", "--order-check"}, "device-plugin-without-toolkit\n", 1},
		{[]string{"--node", "lab-node-0", "--order-check"}, "ok\n", 0},
		{[]string{"--node", "lab-node-1", "--order-check"}, "ok\n", 0},
	}

	check := func(stage string, cases []want) {
		t.Helper()
		files := snapshotFiles(t)
		for _, c := range cases {
			args := append([]string{"audit"}, c.args...)
			what := fmt.Sprintf("%s: gpu-deploy-guard %s", stage, strings.Join(args, " "))
			fromCluster := product(t, env, args...)
			expectResult(t, what+" (KUBECONFIG)", fromCluster, c.code, c.stdout, auditNoClusterPolicyCRD)

			fileArgs := append(append([]string{}, args...), "--nodes", files.nodes, "--pods", files.pods)
			expectResult(t, what+" --nodes --pods", product(t, nil, fileArgs...), c.code, c.stdout, "")
			fileArgs = append(fileArgs, "--daemonsets", files.daemonSets)
			expectResult(t, what+" --nodes --pods --daemonsets", product(t, nil, fileArgs...), c.code, c.stdout, "")
		}
	}
	check("two pods Pending", gaps)

	// The two missing operands start running: only the broken pairing is left.
	setPodPhase(t, podOf(t, "nvidia-dcgm-exporter", "lab-node-0").name, "Running")
	setPodPhase(t, podOf(t, "gpu-feature-discovery", "lab-node-1").name, "Running")
	check("all pods Running", allRunning)

	// An unknown node is bad input: exit 2.
	got := product(t, env, "audit", "--node", "lab-node-9")
	expectResult(t, "gpu-deploy-guard audit --node lab-node-9", got, 2, "",
		auditNoClusterPolicyCRD+"error: node lab-node-9 is not among the 3 nodes audited\n")
}

// snapshot holds the cluster's state as `kubectl get -o json` files, the
// input of a file audit.
type snapshot struct{ nodes, pods, daemonSets string }

func snapshotFiles(t *testing.T) snapshot {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, args ...string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(cp.MustKubectl(t, args...)), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	return snapshot{
		nodes:      write("nodes.json", "get", "nodes", "-o", "json"),
		pods:       write("pods.json", "get", "pods", "-n", operatorNS, "-o", "json"),
		daemonSets: write("daemonsets.json", "get", "daemonsets", "-n", operatorNS, "-o", "json"),
	}
}
