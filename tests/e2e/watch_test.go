package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The shared webhook runs without cluster access (no kubeconfig), so it
// decides with the GPU Operator's defaults and runs no audit. The tests here
// start a second `serve` that watches the cluster the way the Deployment in
// deploy/base does: as the webhook's service account, with a token the API
// server issued, holding only the RBAC of deploy/base/rbac.yaml.

const (
	watchStartTimeout = 30 * time.Second // the first audit after /readyz: pods and nodes listed, 1 s debounce
	watchFollow       = 30 * time.Second // a change reaching the gauges, the report or the decisions
	clusterPolicyName = "cluster-policy"
	metricPrefix      = "gpu_deploy_guard_"
)

// installWatchedCRDs serves ClusterPolicy and ClusterPolicyReport (schema-less
// stand-ins) until the test ends.
func installWatchedCRDs(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		if got := kubectl("delete", "-f", watchedCRDs, "--ignore-not-found", "--wait=true", "--timeout=60s"); got.code != 0 {
			t.Errorf("cleanup: kubectl delete -f %s: %s", watchedCRDs, got)
		}
	})
	cp.MustKubectl(t, "apply", "-f", watchedCRDs)
	cp.WaitCRDsServed(t, "clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com", "gpuclusters.nvidia.com", "clusterpolicyreports.wgpolicyk8s.io")
}

// applyClusterPolicy creates or updates ClusterPolicy cluster-policy with the
// given spec (JSON).
func applyClusterPolicy(t *testing.T, spec string) {
	t.Helper()
	if got := tryClusterPolicy(spec, "{}"); got.code != 0 {
		t.Fatalf("kubectl apply ClusterPolicy %s: %s", spec, got)
	}
}

// tryClusterPolicy applies ClusterPolicy cluster-policy with the given spec
// and metadata.annotations (JSON) and returns what kubectl said.
func tryClusterPolicy(spec, annotations string) result {
	manifest := fmt.Sprintf(`{"apiVersion":"nvidia.com/v1","kind":"ClusterPolicy","metadata":{"name":%q,"annotations":%s},"spec":%s}`,
		clusterPolicyName, annotations, spec)
	return kubectlWithInput(manifest, "apply", "-f", "-")
}

// startWatchingGuard starts a second `gpu-deploy-guard serve`, with its own
// ports and certificates and the shipped policy, that watches the cluster:
// KUBECONFIG holds a token of the service account gpu-deploy-guard/
// gpu-deploy-guard, bound by deploy/base/rbac.yaml (applied as shipped) and
// nothing else. It returns once /readyz is 200, which serve holds back until
// it has read the ClusterPolicy and the DaemonSets. Stopped, and its RBAC
// removed, when the test ends.
func startWatchingGuard(t *testing.T, extraArgs ...string) *framework.Guard {
	t.Helper()
	return startWatchingReplica(t, watchingRBAC(t), "gpu-deploy-guard-watching", extraArgs...)
}

// registerWatchingGuard starts a watching guard and points the webhook
// configuration at it for this test; when the test ends (before the guard
// stops) the shared webhook is registered again for the other tests.
func registerWatchingGuard(t *testing.T) *framework.Guard {
	t.Helper()
	g := startWatchingGuard(t)
	register(t, g)
	return g
}

// register points the webhook configuration at g for this test; when the
// test ends (before g stops) the shared webhook is registered again.
func register(t *testing.T, g *framework.Guard) {
	t.Helper()
	root := repoRoot(t)
	if err := cp.RegisterGuard(root, g); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.RegisterGuard(root, guard); err != nil {
			t.Errorf("cleanup: registering the shared webhook again: %v", err)
		}
	})
}

// watchingRBAC applies deploy/base's Namespace, ServiceAccount and RBAC as
// shipped (removed when the test ends) and returns a kubeconfig holding the
// service account's token, once RBAC has caught up with every binding.
func watchingRBAC(t *testing.T) string {
	t.Helper()
	if guard == nil {
		t.Fatal("startWatchingGuard needs the shared webhook's config file: call setUpLab first")
	}
	// deploy/base's Namespace, ServiceAccount and RBAC, as shipped.
	objs, err := cp.Kustomize(filepath.Join(repoRoot(t), "deploy", "base"))
	if err != nil {
		t.Fatal(err)
	}
	var manifests []string
	for _, o := range objs {
		switch o.Kind {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			manifests = append(manifests, string(o.YAML))
		}
	}
	if len(manifests) != 10 {
		t.Fatalf("deploy/base has %d Namespace/ServiceAccount/RBAC objects, want 10", len(manifests))
	}
	t.Cleanup(func() {
		for _, m := range slices.Backward(manifests) {
			if got := kubectlWithInput(m, "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=120s"); got.code != 0 {
				t.Errorf("cleanup: kubectl delete of deploy/base's %s: %s", firstLineOf(m), got)
			}
		}
	})
	for _, m := range manifests {
		if got := kubectlWithInput(m, "apply", "-f", "-"); got.code != 0 {
			t.Fatalf("kubectl apply of deploy/base's %s: %s", firstLineOf(m), got)
		}
	}
	// The token is the service account's, and RBAC has caught up with both
	// bindings (the Role's in the operator namespace; the ClusterRole's,
	// applied last, for nodes, the ClusterPolicy and the report) before serve
	// makes its first call.
	kubeconfig := cp.ServiceAccountKubeconfig(t, "gpu-deploy-guard-sa", guardNS, "gpu-deploy-guard",
		[]string{"watch", "pods", "-n", operatorNS},
		[]string{"watch", "nodes"},
		[]string{"watch", "clusterpolicies.nvidia.com"},
		[]string{"patch", "clusterpolicyreports.wgpolicyk8s.io"},
		[]string{"create", "leases.coordination.k8s.io", "-n", guardNS},
		[]string{"create", "events.events.k8s.io", "-n", "default"})
	return kubeconfig
}

// startWatchingReplica starts one watching serve as the chart runs a replica:
// with the service account's kubeconfig and its pod name and namespace (the
// audit's Lease is held there, under that name).
func startWatchingReplica(t *testing.T, kubeconfig, name string, extraArgs ...string) *framework.Guard {
	t.Helper()
	return startWatchingReplicaWithConfig(t, kubeconfig, name, guard.ConfigFile, extraArgs...)
}

// startWatchingReplicaWithConfig is startWatchingReplica with another policy
// file than the shipped one.
func startWatchingReplicaWithConfig(t *testing.T, kubeconfig, name, configFile string, extraArgs ...string) *framework.Guard {
	t.Helper()
	dir, err := os.MkdirTemp(cp.Dir, name+"-")
	if err != nil {
		t.Fatal(err)
	}
	g, err := framework.StartGuard(framework.GuardConfig{
		Bin: framework.RequireProductBinary(t), Dir: dir, LogDir: cp.LogDir, ConfigFile: configFile,
		Name: name, Env: []string{"KUBECONFIG=" + kubeconfig, "POD_NAME=" + name, "POD_NAMESPACE=" + guardNS},
		ExtraArgs: extraArgs,
	})
	if g != nil {
		t.Cleanup(g.Stop)
	}
	if err != nil {
		t.Fatalf("starting the watching gpu-deploy-guard serve: %v", err)
	}
	return g
}

// firstLineOf names a manifest in messages: its first line with a name.
func firstLineOf(manifest string) string {
	for _, line := range strings.Split(manifest, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "name:") {
			return strings.TrimSpace(line)
		}
	}
	return strings.SplitN(manifest, "\n", 2)[0]
}

// auditGauges is the watching guard's audit on /metrics, one line per
// sample, sorted: `operand_expected lab-node-0 driver 1`,
// `audit_findings device-plugin-without-toolkit 1`, `audit_nodes 3`,
// `cluster_policy_available 1`.
func auditGauges(g *framework.Guard) (string, error) {
	samples, err := g.Metrics()
	if err != nil {
		return "", err
	}
	var lines []string
	for _, s := range samples {
		name := strings.TrimPrefix(s.Name, metricPrefix)
		switch name {
		case "operand_expected", "operand_running":
			lines = append(lines, fmt.Sprintf("%s %s %s %v", name, s.Labels["node"], s.Labels["operand"], s.Value))
		case "audit_findings":
			lines = append(lines, fmt.Sprintf("%s %s %v", name, s.Labels["rule"], s.Value))
		case "audit_nodes", "cluster_policy_available":
			lines = append(lines, fmt.Sprintf("%s %v", name, s.Value))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}

// findingsOf reads audit_findings{rule} of g.
func findingsOf(t *testing.T, g *framework.Guard, rule string) float64 {
	t.Helper()
	v, err := g.Counter(metricPrefix+"audit_findings", map[string]string{"rule": rule})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// gauges builds the expected auditGauges text.
type gauges struct {
	lines []string
}

// operands: each operand has both series on the node, with these values.
func (w *gauges) operands(node string, expected, running int, operands ...string) *gauges {
	for _, op := range operands {
		w.lines = append(w.lines,
			fmt.Sprintf("operand_expected %s %s %d", node, op, expected),
			fmt.Sprintf("operand_running %s %s %d", node, op, running))
	}
	return w
}

// findings: nodes per rule; every rule the audit knows is always exported.
func (w *gauges) findings(counts map[string]int) *gauges {
	for _, rule := range []string{"device-plugin-without-toolkit", "operand-without-toolkit",
		"operand-without-validator", "operand-without-sandbox-validator", "operand-without-dra-driver",
		"dcgm-exporter-without-dcgm", "device-plugin-on-non-gpu-node", "device-plugin-beside-dra-driver", "foreign-device-plugin", "nfd-labels-lost", "operand-not-running", "toolkit-not-recreated",
		"operands-not-recreated", "pause-stuck", "driver-upgrade-stuck", "gpus-not-advertised"} {
		w.lines = append(w.lines, fmt.Sprintf("audit_findings %s %d", rule, counts[rule]))
	}
	return w
}

func (w *gauges) text(nodes, policyAvailable int) string {
	lines := append(slices.Clone(w.lines),
		fmt.Sprintf("audit_nodes %d", nodes), fmt.Sprintf("cluster_policy_available %d", policyAvailable))
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// waitTotals polls /metrics until operand_nodes gives, for each operand named,
// "<expected> <running> <missing>" nodes.
func waitTotals(t *testing.T, g *framework.Guard, timeout time.Duration, what string, want map[string]string) {
	t.Helper()
	framework.WaitFor(t, timeout, "operand_nodes: "+what, func() (bool, string) {
		var diffs []string
		for op, w := range want {
			var got []string
			for _, state := range []string{"expected", "running", "missing"} {
				v, err := g.Counter(metricPrefix+"operand_nodes", map[string]string{"operand": op, "state": state})
				if err != nil {
					return false, err.Error()
				}
				got = append(got, fmt.Sprint(v))
			}
			if have := strings.Join(got, " "); have != w {
				diffs = append(diffs, fmt.Sprintf("%s: got %s, want %s", op, have, w))
			}
		}
		slices.Sort(diffs)
		return len(diffs) == 0, strings.Join(diffs, "; ")
	})
}

// waitGauges polls /metrics until the audit gauges are exactly want.
func waitGauges(t *testing.T, g *framework.Guard, timeout time.Duration, what, want string) {
	t.Helper()
	framework.WaitFor(t, timeout, "the audit gauges: "+what, func() (bool, string) {
		got, err := auditGauges(g)
		if err != nil {
			return false, err.Error()
		}
		return got == want, "\n" + got + "\n--- want ---\n" + want
	})
}

// policyReport is ClusterPolicyReport gpu-deploy-guard in a comparable
// form: one line per result, `<node> <rule> <result> <severity> [basis]`
// (sorted), then the summary; the messages of failed and warned results by
// node/rule.
type policyReport struct {
	text            string
	messages        map[string]string
	resourceVersion string
}

func readPolicyReport() (policyReport, error) {
	stdout, stderr, code := cp.Kubectl("get", "clusterpolicyreport", "gpu-deploy-guard", "-o", "json", "--show-managed-fields")
	if code != 0 {
		return policyReport{}, fmt.Errorf("kubectl get clusterpolicyreport gpu-deploy-guard: exit %d: %s", code, strings.TrimSpace(stderr))
	}
	var r struct {
		Metadata struct {
			ResourceVersion string            `json:"resourceVersion"`
			Labels          map[string]string `json:"labels"`
			ManagedFields   []struct {
				Manager   string `json:"manager"`
				Operation string `json:"operation"`
			} `json:"managedFields"`
		} `json:"metadata"`
		Results []struct {
			Policy, Rule, Result, Severity, Message, Source string
			Resources                                       []struct{ APIVersion, Kind, Name string }
			Properties                                      map[string]string
		} `json:"results"`
		Summary map[string]int `json:"summary"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		return policyReport{}, err
	}
	var problems, lines []string
	if v := r.Metadata.Labels["app.kubernetes.io/managed-by"]; v != "gpu-deploy-guard" {
		problems = append(problems, fmt.Sprintf("label app.kubernetes.io/managed-by=%q", v))
	}
	for _, m := range r.Metadata.ManagedFields {
		if m.Manager != "gpu-deploy-guard" || m.Operation != "Apply" {
			problems = append(problems, fmt.Sprintf("written by %s (%s), not server-side applied by gpu-deploy-guard", m.Manager, m.Operation))
		}
	}
	out := policyReport{messages: map[string]string{}, resourceVersion: r.Metadata.ResourceVersion}
	for _, res := range r.Results {
		if res.Policy != "gpu-deploy-guard" || res.Source != "gpu-deploy-guard" {
			problems = append(problems, fmt.Sprintf("result %s: policy %q source %q", res.Rule, res.Policy, res.Source))
		}
		node := "-"
		if len(res.Resources) == 1 && res.Resources[0].APIVersion == "v1" && res.Resources[0].Kind == "Node" {
			node = res.Resources[0].Name
		} else if len(res.Resources) != 0 {
			problems = append(problems, fmt.Sprintf("result %s: resources %+v", res.Rule, res.Resources))
		}
		line := strings.TrimSpace(strings.Join([]string{node, res.Rule, res.Result, res.Severity, res.Properties["basis"]}, " "))
		lines = append(lines, line)
		if res.Result != "pass" {
			out.messages[node+"/"+res.Rule] = res.Message
		}
	}
	slices.Sort(lines)
	lines = append(lines, fmt.Sprintf("summary pass=%d fail=%d warn=%d error=%d skip=%d",
		r.Summary["pass"], r.Summary["fail"], r.Summary["warn"], r.Summary["error"], r.Summary["skip"]))
	lines = append(lines, problems...)
	out.text = strings.Join(lines, "\n")
	return out, nil
}

// waitReportLines polls the ClusterPolicyReport until its text has every one
// of lines, and returns it.
func waitReportLines(t *testing.T, what string, lines ...string) policyReport {
	t.Helper()
	var last policyReport
	framework.WaitFor(t, watchFollow, what, func() (bool, string) {
		r, err := readPolicyReport()
		if err != nil {
			return false, err.Error()
		}
		last = r
		for _, l := range lines {
			if !strings.Contains(r.text, l) {
				return false, r.text
			}
		}
		return true, ""
	})
	return last
}

// waitFinding polls the ClusterPolicyReport until its text has line and the
// message of key ("node/rule") starts with prefix.
func waitFinding(t *testing.T, what, line, key, prefix string) {
	t.Helper()
	framework.WaitFor(t, watchFollow, what, func() (bool, string) {
		r, err := readPolicyReport()
		if err != nil {
			return false, err.Error()
		}
		if !strings.Contains(r.text, line) {
			return false, r.text
		}
		msg := r.messages[key]
		return strings.HasPrefix(msg, prefix), msg
	})
}

// reportLines builds the expected policyReport text: every rule of the
// audit for each node (pass unless listed in notPass as "rule result
// [basis]"), then the summary counted from them.
func reportLines(nodes map[string][]string) string {
	severity := map[string]string{
		"device-plugin-without-toolkit":     "high",
		"operand-without-toolkit":           "medium",
		"operand-without-validator":         "medium",
		"operand-without-sandbox-validator": "medium",
		"operand-without-dra-driver":        "medium",
		"dcgm-exporter-without-dcgm":        "medium",
		"device-plugin-on-non-gpu-node":     "low",
		"device-plugin-beside-dra-driver":   "high",
		"foreign-device-plugin":             "high",
		"nfd-labels-lost":                   "medium",
		"operand-not-running":               "medium",
		"toolkit-not-recreated":             "high",
		"operands-not-recreated":            "medium",
		"pause-stuck":                       "medium",
		"driver-upgrade-stuck":              "medium",
		"gpus-not-advertised":               "medium",
	}
	count := map[string]int{}
	var lines []string
	for node, notPass := range nodes {
		for rule, sev := range severity {
			line := node + " " + rule + " pass " + sev
			for _, np := range notPass {
				if r, rest, _ := strings.Cut(np, " "); r == rule {
					result, basis, _ := strings.Cut(rest, " ")
					line = strings.TrimSpace(node + " " + rule + " " + result + " " + sev + " " + basis)
				}
			}
			count[strings.Fields(line)[2]]++
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	return strings.Join(append(lines, fmt.Sprintf("summary pass=%d fail=%d warn=%d error=0 skip=0",
		count["pass"], count["fail"], count["warn"])), "\n")
}

// waitReport polls the ClusterPolicyReport until its results are exactly want
// and each result named in messages ("node/rule") has that message. The
// messages are part of the wait: an audit that ran before a pod existed gives
// the same results with another message, and is replaced one debounce later.
func waitReport(t *testing.T, timeout time.Duration, what, want string, messages map[string]string) policyReport {
	t.Helper()
	var last policyReport
	framework.WaitFor(t, timeout, "ClusterPolicyReport gpu-deploy-guard: "+what, func() (bool, string) {
		r, err := readPolicyReport()
		if err != nil {
			return false, err.Error()
		}
		last = r
		if r.text != want {
			return false, "\n" + r.text + "\n--- want ---\n" + want
		}
		for key, msg := range messages {
			if got := r.messages[key]; got != msg {
				return false, fmt.Sprintf("message of %s:\ngot  %q\nwant %q", key, got, msg)
			}
		}
		return true, ""
	})
	return last
}

var labOperands = []string{"driver", "container-toolkit", "device-plugin", "gpu-feature-discovery", "dcgm-exporter"}

// TestServeGaugesAndReportFollowALabelChange: serve's continuous audit, as
// deploy/base runs it (the shipped service account and RBAC, --report),
// against the lab with every operand pod Running and lab-node-2 running the
// device plugin alone. The gauges and the ClusterPolicyReport must state
// exactly that, and then follow two label changes: the DCGM exporter
// switched off on lab-node-1 (its count drops; lab-node-1 is clean and has no
// per-node series before or after), and lab-node-2 repaired
// with the toolkit (its pod first reported Pending: a missing operand; then
// Running: clean).
func TestServeGaugesAndReportFollowALabelChange(t *testing.T) {
	setUpIncidentLab(t)
	installWatchedCRDs(t)
	applyClusterPolicy(t, `{"operator":{"defaultRuntime":"containerd"}}`)
	// Taken before serve starts: its first audit runs before it is ready, so
	// before startWatchingGuard returns, possibly in an earlier second.
	before := time.Now().Unix()
	g := startWatchingGuard(t, "--report")
	// The watches must resume from resourceVersions, never fall back to re-listing on every
	// event (which is what kube's watcher does with objects that lack one).
	t.Cleanup(func() {
		log, err := os.ReadFile(g.LogPath())
		if err != nil {
			t.Errorf("reading the watching serve's log: %v", err)
			return
		}
		if n := strings.Count(string(log), "no metadata.resourceVersion"); n > 0 {
			t.Errorf("the cluster watch re-listed %d times for events without a resourceVersion", n)
		}
	})

	// Per-node series only for lab-node-2, the node with findings; the fleet
	// is counted per operand.
	want := new(gauges).
		operands("lab-node-2", 1, 1, "device-plugin").
		findings(map[string]int{"device-plugin-without-toolkit": 1, "device-plugin-on-non-gpu-node": 1})
	waitGauges(t, g, watchStartTimeout, "the lab with the incident", want.text(3, 1))
	waitTotals(t, g, watchFollow, "the lab with the incident", map[string]string{
		"device-plugin": "3 3 0", "container-toolkit": "2 2 0", "dcgm-exporter": "2 2 0", "driver": "1 1 0",
	})
	if leader, err := g.Counter(metricPrefix+"audit_leader", nil); err != nil || leader != 1 {
		t.Errorf("audit_leader = %v (%v), want 1: the only replica holds the audit's Lease", leader, err)
	}
	ts, err := g.Counter(metricPrefix+"audit_last_run_timestamp_seconds", nil)
	if err != nil {
		t.Fatal(err)
	}
	if int64(ts) < before || int64(ts) > time.Now().Unix() {
		t.Errorf("audit_last_run_timestamp_seconds = %v, want a time since serve started (%d..now)", ts, before)
	}

	plugin2 := podOf(t, "nvidia-device-plugin-daemonset", "lab-node-2").name
	incident := map[string][]string{
		"lab-node-0": nil,
		"lab-node-1": nil,
		"lab-node-2": {"device-plugin-without-toolkit fail pods", "device-plugin-on-non-gpu-node warn labels"},
	}
	r := waitReport(t, watchStartTimeout, "the lab with the incident", reportLines(incident), map[string]string{
		"lab-node-2/device-plugin-without-toolkit": "node lab-node-2 runs the NVIDIA device plugin (pod " + plugin2 +
			") but no container toolkit pod runs there, so GPU pods scheduled there fail to start; " +
			"set nvidia.com/gpu.deploy.container-toolkit=true or nvidia.com/gpu.deploy.device-plugin=false.",
	})

	// 1. A person switches the DCGM exporter off on lab-node-1 (the webhook
	// allows it). Its pod goes; both of its series go, nothing else moves.
	expectResult(t, "kubectl label node lab-node-1 dcgm-exporter=false --overwrite",
		kubectl("label", "node", "lab-node-1", deployPrefix+"dcgm-exporter=false", "--overwrite"), 0, "node/lab-node-1 labeled\n", "")
	waitPodNodes(t, "nvidia-dcgm-exporter", []string{"lab-node-0"})
	want = new(gauges).
		operands("lab-node-2", 1, 1, "device-plugin").
		findings(map[string]int{"device-plugin-without-toolkit": 1, "device-plugin-on-non-gpu-node": 1})
	waitGauges(t, g, watchFollow, "dcgm-exporter off on lab-node-1", want.text(3, 1))
	waitTotals(t, g, watchFollow, "dcgm-exporter off on lab-node-1", map[string]string{"dcgm-exporter": "1 1 0"})
	// The audit ran again, with the same results: the report is not rewritten.
	if again, err := readPolicyReport(); err != nil || again.text != r.text || again.resourceVersion != r.resourceVersion {
		t.Errorf("ClusterPolicyReport after a change that alters no result (err %v): resourceVersion %s -> %s, want unchanged:\n%s",
			err, r.resourceVersion, again.resourceVersion, again.text)
	}

	// 2. A person repairs lab-node-2: the toolkit label. Its pod is created
	// and reported Pending (kwok runs it at once; the test reports it Pending,
	// as a kubelet does while the image is pulled): an expected operand is
	// missing, and the device plugin still runs without a toolkit.
	predicted := predict(t, "lab-node-2", deployPrefix+"container-toolkit=true")
	got := kubectl("label", "node", "lab-node-2", deployPrefix+"container-toolkit=true")
	expectResult(t, "kubectl label node lab-node-2 container-toolkit=true", got, 0, "node/lab-node-2 labeled\n",
		"Warning: lab-node-2: device-plugin already runs on a node with no NVIDIA GPU label\n")
	expectAgreesWithCheck(t, predicted, got)
	waitPodNodes(t, "nvidia-container-toolkit-daemonset", []string{"lab-node-0", "lab-node-1", "lab-node-2"})
	toolkit2 := reportPending(t, "nvidia-container-toolkit-daemonset", "lab-node-2")
	want = new(gauges).
		operands("lab-node-2", 1, 1, "device-plugin").
		operands("lab-node-2", 1, 0, "container-toolkit").
		findings(map[string]int{"device-plugin-without-toolkit": 1, "device-plugin-on-non-gpu-node": 1, "operand-not-running": 1})
	waitGauges(t, g, watchFollow, "the toolkit on lab-node-2, Pending", want.text(3, 1))
	waitTotals(t, g, watchFollow, "the toolkit on lab-node-2, Pending", map[string]string{"container-toolkit": "3 2 1"})
	waitReport(t, watchFollow, "the toolkit on lab-node-2, Pending", reportLines(map[string][]string{
		"lab-node-0": nil,
		"lab-node-1": nil,
		"lab-node-2": {"device-plugin-without-toolkit fail pods", "device-plugin-on-non-gpu-node warn labels", "operand-not-running fail pods"},
	}), map[string]string{
		"lab-node-2/device-plugin-without-toolkit": "node lab-node-2 runs the NVIDIA device plugin (pod " + plugin2 +
			") but its container toolkit pod " + toolkit2 + " is Pending, so GPU pods scheduled there fail to start; " +
			"set nvidia.com/gpu.deploy.container-toolkit=true or nvidia.com/gpu.deploy.device-plugin=false.",
		"lab-node-2/operand-not-running": "node lab-node-2: expected operands are not running: " +
			"container-toolkit (nvidia.com/gpu.deploy.container-toolkit=true; pod " + toolkit2 + " is Pending).",
	})

	// 3. The toolkit pod runs: lab-node-2 is sound, only the GPU-label
	// warning is left.
	setPodPhase(t, toolkit2, "Running")
	want = new(gauges).
		operands("lab-node-2", 1, 1, "device-plugin", "container-toolkit").
		findings(map[string]int{"device-plugin-on-non-gpu-node": 1})
	waitGauges(t, g, watchFollow, "the toolkit on lab-node-2, Running", want.text(3, 1))
	waitReport(t, watchFollow, "the toolkit on lab-node-2, Running", reportLines(map[string][]string{
		"lab-node-0": nil,
		"lab-node-1": nil,
		"lab-node-2": {"device-plugin-on-non-gpu-node warn labels"},
	}), nil)
}

// TestAuditFailsOverToAnotherReplica: two replicas, as the chart runs them,
// elect one auditor with the audit's Lease; the other answers reviews but
// exports no per-node series and writes no report. The auditor is killed
// (SIGKILL: no hand-over, as when its node dies). Within the Lease's duration
// the other replica takes over, and its gauges and the ClusterPolicyReport
// follow a label change made after the kill.
func TestAuditFailsOverToAnotherReplica(t *testing.T) {
	setUpIncidentLab(t)
	installWatchedCRDs(t)
	applyClusterPolicy(t, `{"operator":{"defaultRuntime":"containerd"}}`)
	kubeconfig := watchingRBAC(t)
	const leaseDuration = 6 * time.Second
	args := []string{"--report", "--audit-lease-duration=" + leaseDuration.String()}
	a := startWatchingReplica(t, kubeconfig, "gpu-deploy-guard-replica-a", args...)
	b := startWatchingReplica(t, kubeconfig, "gpu-deploy-guard-replica-b", args...)

	leaders := func() (float64, float64, error) {
		la, err := a.Counter(metricPrefix+"audit_leader", nil)
		if err != nil {
			return 0, 0, err
		}
		lb, err := b.Counter(metricPrefix+"audit_leader", nil)
		return la, lb, err
	}
	var holder, other *framework.Guard
	framework.WaitFor(t, watchStartTimeout, "exactly one replica holds the audit's Lease", func() (bool, string) {
		la, lb, err := leaders()
		if err != nil {
			return false, err.Error()
		}
		switch {
		case la == 1 && lb == 0:
			holder, other = a, b
		case la == 0 && lb == 1:
			holder, other = b, a
		default:
			return false, fmt.Sprintf("audit_leader: %s %v, %s %v", a.Name, la, b.Name, lb)
		}
		return true, ""
	})
	lease := func() string {
		out, _, code := cp.Kubectl("get", "lease", "gpu-deploy-guard-audit", "-n", guardNS, "-o", "jsonpath={.spec.holderIdentity}")
		if code != 0 {
			return ""
		}
		return out
	}
	if got := lease(); got != holder.Name {
		t.Errorf("Lease gpu-deploy-guard-audit is held by %q, want %q (the replica whose audit_leader is 1)", got, holder.Name)
	}
	incident := new(gauges).
		operands("lab-node-2", 1, 1, "device-plugin").
		findings(map[string]int{"device-plugin-without-toolkit": 1, "device-plugin-on-non-gpu-node": 1})
	waitGauges(t, holder, watchStartTimeout, "the auditor, on the lab with the incident", incident.text(3, 1))
	idle := new(gauges).findings(nil)
	waitGauges(t, other, watchFollow, "the replica that does not audit", idle.text(0, 1))
	waitReport(t, watchStartTimeout, "written by the auditor", reportLines(map[string][]string{
		"lab-node-0": nil,
		"lab-node-1": nil,
		"lab-node-2": {"device-plugin-without-toolkit fail pods", "device-plugin-on-non-gpu-node warn labels"},
	}), nil)

	holder.Kill()
	killed := time.Now()
	// A person repairs lab-node-2 while no replica audits: the toolkit pod is
	// created and reported Pending, a change only a new auditor can report.
	if got := kubectl("label", "node", "lab-node-2", deployPrefix+"container-toolkit=true"); got.code != 0 {
		t.Fatalf("kubectl label node lab-node-2 container-toolkit=true: %s", got)
	}
	waitPodNodes(t, "nvidia-container-toolkit-daemonset", []string{"lab-node-0", "lab-node-1", "lab-node-2"})
	reportPending(t, "nvidia-container-toolkit-daemonset", "lab-node-2")
	framework.WaitFor(t, leaseDuration+watchFollow, "the other replica takes the audit's Lease over", func() (bool, string) {
		l, err := other.Counter(metricPrefix+"audit_leader", nil)
		if err != nil {
			return false, err.Error()
		}
		return l == 1, fmt.Sprintf("audit_leader of %s: %v", other.Name, l)
	})
	took := time.Since(killed)
	t.Logf("the audit failed over in %s (Lease duration %s)", took.Round(100*time.Millisecond), leaseDuration)
	// The Lease expires at most its duration after the last renewal; the
	// replica then takes it within its retry (up to a second), an API round
	// trip and a poll of /metrics, which a loaded 2-core CI machine can
	// stretch: the bound is generous, the figure is logged.
	if limit := leaseDuration + 6*time.Second; took > limit {
		t.Errorf("the audit failed over after %s, want within the Lease's duration (%s, plus %s to take it)",
			took.Round(100*time.Millisecond), leaseDuration, limit-leaseDuration)
	}
	if got := lease(); got != other.Name {
		t.Errorf("Lease gpu-deploy-guard-audit is held by %q after the failover, want %q", got, other.Name)
	}
	pending := new(gauges).
		operands("lab-node-2", 1, 1, "device-plugin").
		operands("lab-node-2", 1, 0, "container-toolkit").
		findings(map[string]int{"device-plugin-without-toolkit": 1, "device-plugin-on-non-gpu-node": 1, "operand-not-running": 1})
	waitGauges(t, other, watchFollow, "the new auditor, the toolkit on lab-node-2 Pending", pending.text(3, 1))
	waitReport(t, watchFollow, "written by the new auditor", reportLines(map[string][]string{
		"lab-node-0": nil,
		"lab-node-1": nil,
		"lab-node-2": {"device-plugin-without-toolkit fail pods", "device-plugin-on-non-gpu-node warn labels", "operand-not-running fail pods"},
	}), nil)
}

// dryRunPluginOnLabNode2 asks the API server whether a person may set
// device-plugin=true on lab-node-2, changing nothing.
func dryRunPluginOnLabNode2() result {
	return kubectl("label", "node", "lab-node-2", labNode2PluginOnly, "--dry-run=server")
}

// waitDecision repeats the dry run until the API server gives want (the
// watching webhook learns about a ClusterPolicy change within its debounce).
// Any answer other than the allowed and the refused one fails at once.
func waitDecision(t *testing.T, what string, want result) {
	t.Helper()
	allowed := result{"node/lab-node-2 labeled (server dry run)\n", "Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n", 0}
	refused := result{"", labNode2Refusal, 1}
	framework.WaitFor(t, watchFollow, what, func() (bool, string) {
		got := dryRunPluginOnLabNode2()
		if got != allowed && got != refused {
			t.Fatalf("%s: kubectl label node lab-node-2 device-plugin=true --dry-run=server: neither allowed nor refused as expected:\n%s", what, got)
		}
		return got == want, got.String()
	})
}

// TestClusterPolicyWithHostToolkitAllowsDevicePluginAlone: with
// spec.toolkit.enabled false in the ClusterPolicy, the hosts bring their own
// container toolkit and a device plugin without the toolkit label is the
// normal state. A webhook that watches the cluster must then allow what it
// refuses by default, and refuse it again once the toolkit is managed again
// or the ClusterPolicy is gone. The webhook configuration points at the
// watching serve for this test only.
func TestClusterPolicyWithHostToolkitAllowsDevicePluginAlone(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() { restoreLab(t) })
	installWatchedCRDs(t)
	t.Cleanup(func() {
		if got := kubectl("delete", "clusterpolicy", clusterPolicyName, "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	g := registerWatchingGuard(t)
	policyAvailable := func(want float64) {
		t.Helper()
		framework.WaitFor(t, watchFollow, fmt.Sprintf("cluster_policy_available %v", want), func() (bool, string) {
			v, err := g.Counter(metricPrefix+"cluster_policy_available", nil)
			return err == nil && v == want, fmt.Sprintf("%v %v", v, err)
		})
	}

	// No ClusterPolicy yet: the operator's defaults, the toolkit is managed.
	policyAvailable(0)
	expectResult(t, "no ClusterPolicy: kubectl label node lab-node-2 device-plugin=true --dry-run=server",
		dryRunPluginOnLabNode2(), 1, "", labNode2Refusal)

	// A first ClusterPolicy is judged against the operand DaemonSets that run
	// (the lab's toolkit among them): switching the toolkit off under the
	// running device plugins needs the word that the hosts bring their own.
	if got := tryClusterPolicy(`{"toolkit":{"enabled":false}}`, "{}"); got.code != 1 ||
		!strings.Contains(got.stderr, `denied the request: ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes (lab-node-0, lab-node-1)`) {
		t.Fatalf("a first ClusterPolicy with the toolkit off over the running toolkit DaemonSet: want refused naming the nodes, got %s", got)
	}
	if got := tryClusterPolicy(`{"toolkit":{"enabled":false}}`, `{"gpu-deploy-guard.nvidia.com/toolkit-on-hosts":"the lab's hosts"}`); got.code != 0 {
		t.Fatalf("a first ClusterPolicy with the toolkit off and toolkit-on-hosts: want allowed, got %s", got)
	}
	policyAvailable(1)
	waitDecision(t, "toolkit.enabled=false: allowed", result{"node/lab-node-2 labeled (server dry run)\n",
		"Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n", 0})
	denied := reviews(t, g, "denied", "UPDATE")
	expectResult(t, "toolkit.enabled=false: kubectl label node lab-node-2 device-plugin=true",
		kubectl("label", "node", "lab-node-2", labNode2PluginOnly), 0, "node/lab-node-2 labeled\n",
		"Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n")
	if now := reviews(t, g, "denied", "UPDATE"); now != denied {
		t.Errorf("the watching webhook's denied UPDATE reviews went from %v to %v on an allowed change", denied, now)
	}
	waitDesired(t, "nvidia-device-plugin-daemonset", "3")
	// Turning it off again is always allowed.
	expectResult(t, "kubectl label node lab-node-2 device-plugin-",
		kubectl("label", "node", "lab-node-2", deployPrefix+"device-plugin-"), 0, "node/lab-node-2 unlabeled\n", "")
	waitDesired(t, "nvidia-device-plugin-daemonset", "2")

	// The toolkit managed by the operator again: refused again.
	applyClusterPolicy(t, `{"toolkit":{"enabled":true}}`)
	waitDecision(t, "toolkit.enabled=true: refused", result{"", labNode2Refusal, 1})

	// Host toolkit again, then the ClusterPolicy deleted: the defaults
	// (toolkit managed) apply, refused. Switching the managed toolkit off
	// while device plugins run is refused by the policy webhook unless the
	// same request says the hosts bring their own toolkit.
	got := tryClusterPolicy(`{"toolkit":{"enabled":false}}`, "{}")
	if got.code != 1 || !strings.Contains(got.stderr, `denied the request: ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes (lab-node-0, lab-node-1)`) ||
		!strings.Contains(got.stderr, "gpu-deploy-guard.nvidia.com/toolkit-on-hosts") {
		t.Errorf("toolkit switched off without saying the hosts bring it: want refused naming the nodes and the annotation, got %s", got)
	}
	if got := tryClusterPolicy(`{"toolkit":{"enabled":false}}`, `{"gpu-deploy-guard.nvidia.com/toolkit-on-hosts":"the lab's hosts"}`); got.code != 0 {
		t.Fatalf("toolkit switched off with toolkit-on-hosts: want allowed, got %s", got)
	}
	waitDecision(t, "toolkit.enabled=false again: allowed", result{"node/lab-node-2 labeled (server dry run)\n",
		"Warning: lab-node-2: device-plugin runs on a node with no NVIDIA GPU label\n", 0})
	cp.MustKubectl(t, "delete", "clusterpolicy", clusterPolicyName)
	waitDecision(t, "ClusterPolicy deleted: refused", result{"", labNode2Refusal, 1})
	policyAvailable(0)

	// A GPUCluster and no ClusterPolicy: the DRA stack (v26.7), which runs no
	// device plugin, so the same label selects nothing and is allowed without
	// a word; the GPUCluster deleted, it is refused again.
	t.Cleanup(func() {
		if got := kubectl("delete", "gpucluster", "gpu-cluster", "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	gpuCluster := "apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\nspec:\n  dcgmExporter:\n    enabled: true\n"
	if got := kubectlWithInput(gpuCluster, "apply", "-f", "-"); got.code != 0 {
		t.Fatalf("kubectl apply of GPUCluster gpu-cluster: %s", got)
	}
	dra := result{"node/lab-node-2 labeled (server dry run)\n", "", 0}
	framework.WaitFor(t, watchFollow, "GPUCluster gpu-cluster: the DRA stack, allowed", func() (bool, string) {
		got := dryRunPluginOnLabNode2()
		return got == dra, got.String()
	})
	cp.MustKubectl(t, "delete", "gpucluster", "gpu-cluster")
	refused := result{"", labNode2Refusal, 1}
	framework.WaitFor(t, watchFollow, "GPUCluster deleted: refused", func() (bool, string) {
		got := dryRunPluginOnLabNode2()
		if got != dra && got != refused {
			t.Fatalf("GPUCluster deleted: kubectl label node lab-node-2 device-plugin=true --dry-run=server: neither the DRA stack's answer nor refused:\n%s", got)
		}
		return got == refused, got.String()
	})
}
