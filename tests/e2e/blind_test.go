package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// TestClusterPolicySwitchedOffInTwoStepsIsRefused: the toolkit cannot be
// switched off under the lab's running device plugins in two steps either.
// A second ClusterPolicy with the toolkit off is only ignored by the
// operator (allowed, warned); deleting the followed one would hand the
// operator to it, so that DELETE is refused, with --cascade=orphan as
// without. Deleting the ignored one, and then the only one (orphaning the
// operand DaemonSets), is allowed; a ClusterPolicy created then with the
// toolkit off is judged against the DaemonSets that still run, and refused.
func TestClusterPolicySwitchedOffInTwoStepsIsRefused(t *testing.T) {
	g := setUpPolicyLab(t)
	createClusterPolicy(t)
	t.Cleanup(func() {
		if got := kubectl("delete", "clusterpolicy", "second", "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	toolkitOff := clusterPolicyManifest(t, map[string]bool{"toolkit": false})
	second := strings.Replace(toolkitOff, "name: "+clusterPolicyName, "name: second", 1)
	expectResult(t, "kubectl create ClusterPolicy second (toolkit off)", kubectlWithInput(second, "create", "-f", "-"),
		0, "clusterpolicy.nvidia.com/second created\n",
		"Warning: ClusterPolicy second: ClusterPolicy cluster-policy already exists; the GPU Operator follows one ClusterPolicy and marks the others ignored.\n")

	handOver := "ClusterPolicy cluster-policy (deleted: the GPU Operator then follows ClusterPolicy second): " +
		strings.TrimPrefix(toolkitRefusal, "ClusterPolicy cluster-policy: ")
	// The guard learns of "second" from its watch (this replica's own creation
	// counts at once, but only the watch says which one the operator follows
	// next).
	want := result{"", policyForbidden + handOver + "\n", 1}
	framework.WaitFor(t, watchFollow, "deleting the followed ClusterPolicy refused (dry run)", func() (bool, string) {
		got := kubectl("delete", "clusterpolicy", clusterPolicyName, "--dry-run=server")
		return got == want, got.String()
	})
	denied := policyReviews(t, g, "ClusterPolicy", "denied", "DELETE")
	for _, cascade := range []string{"--cascade=orphan", "--cascade=background"} {
		expectResult(t, "kubectl delete clusterpolicy cluster-policy "+cascade, kubectl("delete", "clusterpolicy", clusterPolicyName, cascade),
			want.code, want.stdout, want.stderr)
	}
	if now := policyReviews(t, g, "ClusterPolicy", "denied", "DELETE"); now != denied+2 {
		t.Errorf("denied ClusterPolicy DELETE reviews went from %v to %v, want +2", denied, now)
	}
	expectResult(t, "kubectl get clusterpolicies", kubectl("get", "clusterpolicies", "-o", "name"), 0,
		"clusterpolicy.nvidia.com/cluster-policy\nclusterpolicy.nvidia.com/second\n", "")

	expectResult(t, "kubectl delete clusterpolicy second (ignored)", kubectl("delete", "clusterpolicy", "second"),
		0, `clusterpolicy.nvidia.com "second" deleted`+"\n", "")
	// The only one: the operand DaemonSets stay, orphaned.
	framework.WaitFor(t, watchFollow, "the only ClusterPolicy deleted with --cascade=orphan", func() (bool, string) {
		got := kubectl("delete", "clusterpolicy", clusterPolicyName, "--cascade=orphan")
		return got.code == 0, got.String()
	})
	recreate := result{"", `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied + toolkitRefusal + "\n", 1}
	framework.WaitFor(t, watchFollow, "a ClusterPolicy with the toolkit off created over the orphaned DaemonSets (dry run)", func() (bool, string) {
		got := kubectlWithInput(toolkitOff, "create", "-f", "-", "--dry-run=server")
		return got == recreate, got.String()
	})
	expectResult(t, "kubectl create ClusterPolicy cluster-policy (toolkit off) over the orphaned DaemonSets",
		kubectlWithInput(toolkitOff, "create", "-f", "-"), recreate.code, recreate.stdout, recreate.stderr)
	expectResult(t, "kubectl get clusterpolicies", kubectl("get", "clusterpolicies", "-o", "name"), 0, "", "")
}

// TestPolicyCreationsInOneApplyAreJudgedAgainstEachOther: `kubectl apply -f`
// of two objects that must not exist together sends the second creation
// milliseconds after the first, long before the guard's watch shows the
// first. Each time (five rounds of each) the second is refused and not
// stored: two NVIDIADrivers with one nodeSelector, and a ClusterPolicy with
// a GPUCluster (v26.7, the version the guard assumes here).
func TestPolicyCreationsInOneApplyAreJudgedAgainstEachOther(t *testing.T) {
	setUpPolicyLab(t)
	withGPUClusterCRD(t)
	waitGone := func(kind string) {
		framework.WaitFor(t, watchFollow, "no "+kind+" left", func() (bool, string) {
			got := kubectl("get", kind, "-o", "name")
			return got.code == 0 && got.stdout == "", got.String()
		})
		// The guard's watch follows within its debounce.
		time.Sleep(2 * time.Second)
	}

	selector := `{"nvidia.com/gpu.present":"true"}`
	drivers := nvidiaDriver("race-a", selector) + "\n---\n" + nvidiaDriver("race-b", selector)
	overlapPrefix := `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied +
		"NVIDIADriver race-b: its nodeSelector selects "
	for round := 1; round <= 5; round++ {
		got := kubectlWithInput(drivers, "apply", "-f", "-")
		if got.code != 1 || got.stdout != "nvidiadriver.nvidia.com/race-a created\n" || !strings.HasPrefix(got.stderr, overlapPrefix) ||
			!strings.Contains(got.stderr, "that NVIDIADriver race-a selects too") {
			t.Fatalf("round %d: kubectl apply of two NVIDIADrivers with one nodeSelector: want race-a created and race-b refused for the overlap\ngot %s", round, got)
		}
		expectResult(t, fmt.Sprintf("round %d: kubectl get nvidiadrivers", round), kubectl("get", "nvidiadrivers", "-o", "name"),
			0, "nvidiadriver.nvidia.com/race-a\n", "")
		cp.MustKubectl(t, "delete", "nvidiadriver", "race-a")
		waitGone("nvidiadrivers")
	}

	stacks := clusterPolicyManifest(t, nil) + "\n---\napiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\nspec: {}\n"
	conflict := `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied +
		"GPUCluster gpu-cluster: ClusterPolicy cluster-policy exists, and the GPU Operator (v26.7) reconciles neither while both exist"
	for round := 1; round <= 5; round++ {
		got := kubectlWithInput(stacks, "apply", "-f", "-")
		if got.code != 1 || got.stdout != "clusterpolicy.nvidia.com/cluster-policy created\n" || !strings.HasPrefix(got.stderr, conflict) {
			t.Fatalf("round %d: kubectl apply of a ClusterPolicy and a GPUCluster: want the ClusterPolicy created and the GPUCluster refused\ngot %s", round, got)
		}
		expectResult(t, fmt.Sprintf("round %d: kubectl get gpuclusters", round), kubectl("get", "gpuclusters", "-o", "name"),
			0, "", "")
		cp.MustKubectl(t, "delete", "clusterpolicy", clusterPolicyName)
		waitGone("clusterpolicies")
	}
}

// TestAccessLostAndRestoredIsFollowedAtOnce: the watching guard's
// ClusterRoleBinding is deleted and the API server restarted (which ends
// every watch, so each kind is listed again and refused: access lost after
// start). The guard then knows neither the nodes nor the ClusterPolicy: the
// toolkit switched off is refused saying why, and
// cluster_policy_available is 0. Once the binding is back, each kind is
// listed again within seconds, not at the watcher's next resume: the refusal
// names the lab's nodes again and cluster_policy_available is 1.
func TestAccessLostAndRestoredIsFollowedAtOnce(t *testing.T) {
	g := setUpPolicyLab(t)
	createClusterPolicy(t)
	objs, err := cp.Kustomize(filepath.Join(repoRoot(t), "deploy", "base"))
	if err != nil {
		t.Fatal(err)
	}
	var binding string
	for _, o := range objs {
		if o.Kind == "ClusterRoleBinding" {
			binding = string(o.YAML)
		}
	}
	if binding == "" {
		t.Fatal("deploy/base has no ClusterRoleBinding")
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if got := kubectlWithInput(binding, "apply", "-f", "-"); got.code != 0 {
				t.Errorf("kubectl apply of deploy/base's ClusterRoleBinding: %s", got)
			}
		}
	}
	t.Cleanup(restore)
	policyAvailable := func() float64 {
		v, err := g.Counter(metricPrefix+"cluster_policy_available", nil)
		if err != nil {
			return -1
		}
		return v
	}
	nodesReadable := func() float64 {
		v, err := g.Counter(metricPrefix+"cluster_watch_readable", map[string]string{"kind": "nodes"})
		if err != nil {
			return -1
		}
		return v
	}

	cp.MustKubectl(t, "delete", "clusterrolebinding", "gpu-deploy-guard")
	if err := cp.RestartAPIServer(time.Second); err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	patch := func() result {
		return kubectl("patch", "clusterpolicy", clusterPolicyName, "--type=merge",
			"-p", `{"spec":{"toolkit":{"enabled":false}}}`, "--dry-run=server")
	}
	blind := policyForbidden + "ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet " +
		"while the NVIDIA device plugin keeps running wherever its deploy label is (the nodes are not known: RBAC forbids this replica to list the nodes)"
	framework.WaitFor(t, watchFollow, "the toolkit switch-off refused, the nodes unknown for want of RBAC", func() (bool, string) {
		got := patch()
		return got.code == 1 && strings.HasPrefix(got.stderr, blind), got.String()
	})
	framework.WaitFor(t, watchFollow, "cluster_policy_available 0", func() (bool, string) {
		v := policyAvailable()
		return v == 0, fmt.Sprintf("cluster_policy_available %v", v)
	})
	framework.WaitFor(t, watchFollow, `cluster_watch_readable{kind="nodes"} 0`, func() (bool, string) {
		v := nodesReadable()
		return v == 0, fmt.Sprintf("cluster_watch_readable{kind=nodes} %v", v)
	})

	restore()
	back := time.Now()
	waitFleetKnown(t)
	framework.WaitFor(t, watchFollow, "cluster_policy_available 1", func() (bool, string) {
		v := policyAvailable()
		return v == 1, fmt.Sprintf("cluster_policy_available %v", v)
	})
	framework.WaitFor(t, watchFollow, `cluster_watch_readable{kind="nodes"} 1`, func() (bool, string) {
		v := nodesReadable()
		return v == 1, fmt.Sprintf("cluster_watch_readable{kind=nodes} %v", v)
	})
	took := time.Since(back)
	t.Logf("the guard follows the nodes and the ClusterPolicy again %s after the binding is back", took.Round(100*time.Millisecond))
	// Listing again waits at most 5 s after a refusal; RBAC's own cache and the
	// debounce add a little.
	if took > 20*time.Second {
		t.Errorf("the guard took %s to follow the cluster again, want within 20 s", took.Round(100*time.Millisecond))
	}
}

// TestRecreatedClusterPolicyCRDIsFollowedAtOnce: the ClusterPolicy CRD is
// deleted and created again (an operator reinstalled), and a ClusterPolicy
// created through the guard. Eleven seconds later, past the guard's memory
// of what it admitted itself (10 s), only its watch can know of that
// ClusterPolicy: a GPUCluster beside it is refused for the conflict, since
// the watch lists a kind again within seconds of its coming back (it used to
// take 35 s, and the GPUCluster was allowed meanwhile).
func TestRecreatedClusterPolicyCRDIsFollowedAtOnce(t *testing.T) {
	setUpPolicyLab(t)
	withGPUClusterCRD(t)
	build, err := framework.BuildOperator()
	if err != nil {
		t.Fatal(err)
	}
	policyCRD := filepath.Join(build.CRDDir(), "nvidia.com_clusterpolicies.yaml")
	cp.MustKubectl(t, "delete", "-f", policyCRD, "--wait=true", "--timeout=60s")
	cp.MustKubectl(t, "create", "-f", policyCRD)
	cp.WaitCRDsServed(t, "clusterpolicies.nvidia.com")
	expectResult(t, "kubectl apply of a ClusterPolicy after its CRD came back",
		kubectlWithInput(clusterPolicyManifest(t, nil), "apply", "-f", "-"), 0, "clusterpolicy.nvidia.com/cluster-policy created\n", "")
	created := time.Now()
	time.Sleep(time.Until(created.Add(11 * time.Second)))
	gpuCluster := "apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\nspec: {}\n"
	conflict := `Error from server (Forbidden): error when creating "STDIN": ` + policyDenied +
		"GPUCluster gpu-cluster: ClusterPolicy cluster-policy exists, and the GPU Operator (v26.7) reconciles neither while both exist"
	got := kubectlWithInput(gpuCluster, "apply", "-f", "-")
	if got.code != 1 || got.stdout != "" || !strings.HasPrefix(got.stderr, conflict) {
		t.Fatalf("kubectl apply of a GPUCluster 11 s after the ClusterPolicy: want refused for the conflict\ngot %s", got)
	}
	expectResult(t, "kubectl get gpuclusters", kubectl("get", "gpuclusters", "-o", "name"), 0, "", "")
}

// TestColdStartIsReadyOnlyOnceTheNodesAreListed: a replica that starts
// while RBAC does not yet let it list the nodes (the ClusterRole's nodes rule
// comes back 4 s after the start, as when a chart's RBAC lags its
// Deployment) is not ready meanwhile, so no admission is routed to a replica
// that would decide without the fleet (issue 36 measured 1.2 s ready and
// 17.6 s blind at 15,000 nodes). Once the rule is back it is ready within
// seconds, and its first decision names the lab's nodes.
func TestColdStartIsReadyOnlyOnceTheNodesAreListed(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() { restoreLab(t) })
	installOperatorCRDs(t)
	t.Cleanup(func() {
		if got := kubectl("delete", "clusterpolicy", clusterPolicyName, "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	expectResult(t, "kubectl apply -f "+policyClusterPolicy, kubectlWithInput(clusterPolicyManifest(t, nil), "apply", "-f", "-"),
		0, "clusterpolicy.nvidia.com/cluster-policy created\n", "")
	kubeconfig := watchingRBAC(t)
	objs, err := cp.Kustomize(filepath.Join(repoRoot(t), "deploy", "base"))
	if err != nil {
		t.Fatal(err)
	}
	original, err := framework.Find(objs, "ClusterRole", "gpu-deploy-guard")
	if err != nil {
		t.Fatal(err)
	}
	role := cp.MustKubectl(t, "get", "clusterrole", "gpu-deploy-guard", "-o", "json")
	var cr struct {
		Rules []struct {
			Resources []string `json:"resources"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(role), &cr); err != nil {
		t.Fatalf("clusterrole gpu-deploy-guard: %v", err)
	}
	at := slices.IndexFunc(cr.Rules, func(r struct {
		Resources []string `json:"resources"`
	}) bool {
		return slices.Equal(r.Resources, []string{"nodes"})
	})
	if at < 0 {
		t.Fatalf("clusterrole gpu-deploy-guard has no rule for nodes alone:\n%s", role)
	}
	cp.MustKubectl(t, "patch", "clusterrole", "gpu-deploy-guard", "--type=json",
		"-p", fmt.Sprintf(`[{"op":"remove","path":"/rules/%d"}]`, at))
	sa := "system:serviceaccount:" + guardNS + ":gpu-deploy-guard"
	framework.WaitFor(t, watchFollow, "RBAC to forbid the guard listing nodes", func() (bool, string) {
		got := kubectl("auth", "can-i", "list", "nodes", "--as="+sa)
		return strings.TrimSpace(got.stdout) == "no", got.String()
	})

	const lag = 4 * time.Second
	start := time.Now()
	restored := make(chan error, 1)
	go func() {
		time.Sleep(lag)
		if got := kubectlWithInput(string(original.YAML), "apply", "-f", "-"); got.code != 0 {
			restored <- fmt.Errorf("kubectl apply of the ClusterRole: %s", got)
			return
		}
		restored <- nil
	}()
	g := startWatchingReplica(t, kubeconfig, "gpu-deploy-guard-cold")
	ready := time.Since(start)
	if err := <-restored; err != nil {
		t.Fatal(err)
	}
	t.Logf("ready %s after its start, the nodes listable from %s", ready.Round(100*time.Millisecond), lag)
	if ready < lag {
		t.Fatalf("the replica was ready %s after its start, before RBAC let it list the nodes (%s)", ready.Round(100*time.Millisecond), lag)
	}
	if ready > lag+15*time.Second {
		t.Errorf("the replica was ready %s after its start, want within 15 s of the nodes becoming listable", ready.Round(100*time.Millisecond))
	}
	register(t, g)
	want := result{"", policyForbidden + toolkitRefusal + "\n", 1}
	got := kubectl("patch", "clusterpolicy", clusterPolicyName, "--type=merge",
		"-p", `{"spec":{"toolkit":{"enabled":false}}}`, "--dry-run=server")
	if got != want {
		t.Fatalf("the first decision of the replica just ready: want the refusal naming the lab's nodes\n%s\ngot %s", want, got)
	}
}

// withGPUClusterCRD installs the GPUCluster CRD for this test; when it ends,
// the NVIDIADrivers, GPUClusters and the ClusterPolicy it made go, then the CRD.
func withGPUClusterCRD(t *testing.T) {
	t.Helper()
	crd := gpuClusterCRD(t)
	t.Cleanup(func() {
		for _, args := range [][]string{
			{"delete", "nvidiadrivers", "--all", "--ignore-not-found"},
			{"delete", "gpuclusters", "--all", "--ignore-not-found"},
			{"delete", "clusterpolicy", clusterPolicyName, "--ignore-not-found"},
		} {
			if got := kubectl(args...); got.code != 0 {
				t.Errorf("cleanup: kubectl %s: %s", strings.Join(args, " "), got)
			}
		}
		if got := kubectlWithInput(crd, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete crd gpuclusters.nvidia.com: %s", got)
		}
	})
	if got := kubectlWithInput(crd, "apply", "-f", "-"); got.code != 0 {
		t.Fatalf("kubectl apply of the GPUCluster CRD: %s", got)
	}
	cp.WaitCRDsServed(t, "gpuclusters.nvidia.com")
}
