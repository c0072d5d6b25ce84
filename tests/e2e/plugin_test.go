package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The kubectl plugin: the product binary installed as
// kubectl-gpu_deploy_guard (a symlink on PATH, as krew installs it), run
// through the real kubectl, against the lab.

// kubectlPlugin runs `kubectl gpu-deploy-guard args...` with the admin
// kubeconfig (kubectl passes its environment, not its flags, to plugins).
func kubectlPlugin(t *testing.T, args ...string) result {
	t.Helper()
	bin := framework.RequireProductBinary(t)
	dir := filepath.Join(cp.Dir, "plugin-bin")
	link := filepath.Join(dir, "kubectl-gpu_deploy_guard")
	if _, err := os.Lstat(link); err != nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(bin, link); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(cp.KubectlPath, append([]string{"gpu-deploy-guard"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.KubeconfigPath, "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := 0
	if err := cmd.Run(); err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return result{stdout.String(), stderr.String(), code}
}

// The lab's refusal, as the plugin prints the finding.
const pluginLabNode2Denial = "  deny device-plugin-without-toolkit: node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin " +
	"without the container toolkit (nvidia.com/gpu.deploy.container-toolkit is not set), so GPU pods would be " +
	"scheduled there and fail to start; set nvidia.com/gpu.deploy.container-toolkit=true in the same command, " +
	"or leave the device plugin off (nvidia.com/gpu.deploy.device-plugin=false).\n"

// TestKubectlPluginPredictsTheWebhookAndAppliesOnlyWhenAllAllowed: the
// plugin reads the lab through the kubeconfig and prints, per node, the
// operands before and after and the webhook's verdict with its findings;
// the webhook then decides the same; --apply labels only when every node
// is allowed; bad input exits 2.
func TestKubectlPluginPredictsTheWebhookAndAppliesOnlyWhenAllAllowed(t *testing.T) {
	setUpLab(t)
	// The lab's bad change: denied, nothing applied, even with --apply. No
	// ClusterPolicy CRD and no operator Deployment in the lab: the operator's
	// defaults and its newest version, as the webhook assumes, and the plugin
	// says so.
	expectResult(t, "kubectl gpu-deploy-guard label nodes lab-node-2 device-plugin=true",
		kubectlPlugin(t, "label", "nodes", "lab-node-2", deployPrefix+"device-plugin=true"), 1,
		"note: ClusterPolicy unavailable (the ClusterPolicy CRD (clusterpolicies.nvidia.com) is not installed): "+
			"the GPU Operator's default operand switches are assumed\n"+
			"note: GPU Operator v26.7 assumed (no GPU Operator Deployment in namespace gpu-operator "+
			"(named gpu-operator or labelled app.kubernetes.io/component=gpu-operator))\n"+
			"NODE        OPERANDS BEFORE  OPERANDS AFTER  VERDICT\n"+
			"lab-node-2  -                device-plugin   DENIED\n"+pluginLabNode2Denial+
			"  warn device-plugin-on-non-gpu-node: node lab-node-2: the NVIDIA device plugin runs on a node without "+
			"nvidia.com/gpu.present=true or an NFD NVIDIA PCI label; is this the right node?\n", "")
	// The webhook agrees, with the same sentence.
	expectResult(t, "kubectl label node lab-node-2 device-plugin=true --dry-run=server", dryRunLabNode2(), 1, "", labNode2Refusal)

	got := kubectlPlugin(t, "label", "nodes", "lab-node-1", "lab-node-2", deployPrefix+"device-plugin=true", "--apply")
	if got.code != 1 || !strings.Contains(got.stdout, "nothing applied: a change is denied\n") || strings.Contains(got.stdout, "labeled") {
		t.Fatalf("--apply with lab-node-2 denied:\n%s\nwant exit 1 and nothing applied", got)
	}
	if labels := deployLabels(t, "lab-node-2"); labels != "" {
		t.Fatalf("lab-node-2 deploy labels after a refused --apply: %q", labels)
	}

	// The GPU nodes by selector, the DCGM exporter off: allowed, applied, the
	// operands column loses dcgm-exporter.
	got = kubectlPlugin(t, "label", "nodes", "-l", "nvidia.com/gpu.present=true", deployPrefix+"dcgm-exporter=false", "--apply")
	if got.code != 0 || got.stderr != "" || !strings.Contains(got.stdout, "node/lab-node-0 labeled\nnode/lab-node-1 labeled\n") ||
		strings.Contains(got.stdout, "lab-node-2") || strings.Count(got.stdout, "ALLOWED") != 2 {
		t.Fatalf("-l nvidia.com/gpu.present=true dcgm-exporter=false --apply:\n%s\nwant exit 0, both GPU nodes allowed and labeled", got)
	}
	t.Logf("kubectl gpu-deploy-guard label nodes -l nvidia.com/gpu.present=true dcgm-exporter=false --apply:\n%s", got)
	for _, n := range []string{"lab-node-0", "lab-node-1"} {
		if v := nodeLabels(t, n)[deployPrefix+"dcgm-exporter"]; v != "false" {
			t.Errorf("%s dcgm-exporter=%q after --apply, want false", n, v)
		}
	}
	waitDesired(t, "nvidia-dcgm-exporter", "0")

	// Every node, the toolkit removed: the two nodes running the device
	// plugin are denied (exit 1), the third is allowed.
	got = kubectlPlugin(t, "label", "nodes", "--all", deployPrefix+"container-toolkit-")
	if got.code != 1 || strings.Count(got.stdout, "DENIED") != 2 || !strings.Contains(got.stdout, "lab-node-2") {
		t.Fatalf("--all container-toolkit-:\n%s\nwant exit 1 with two nodes denied", got)
	}

	// Bad input: exit 2, with what is wrong.
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"label", "nodes", "lab-node-0"}, "no label change given"},
		{[]string{"label", "nodes", "no-such-node", deployPrefix + "driver=true"}, `node "no-such-node" not found`},
		{[]string{"label", "nodes", "lab-node-0", "--all", deployPrefix + "driver=true"}, "exactly one of"},
		{[]string{"label", "pods", "lab-node-0", deployPrefix + "driver=true"}, "only nodes"},
		{[]string{"label", "nodes", "lab-node-0", "nvidia.com/gpu.deploy.driver=no good"}, "label value"},
		{[]string{"label", "nodes", "-l", "a=(", deployPrefix + "driver=true"}, "selector"},
		{[]string{"label", "nodes", "lab-node-0", deployPrefix + "driver=true", "--bogus"}, "--bogus"},
	} {
		got := kubectlPlugin(t, c.args...)
		if got.code != 2 || !strings.Contains(got.stderr, c.says) || got.stdout != "" {
			t.Errorf("kubectl gpu-deploy-guard %s:\n%s\nwant exit 2, stderr naming %q", strings.Join(c.args, " "), got, c.says)
		}
	}
}

// TestVersionNamesTheCommitAndCompletionScriptsLoad: --version names the
// commit the binary was built from (build.rs), for the command and for the
// plugin; `completion` writes a script each shell accepts, and refuses an
// unknown shell.
func TestVersionNamesTheCommitAndCompletionScriptsLoad(t *testing.T) {
	bin := framework.RequireProductBinary(t)
	run := func(name string, args ...string) result {
		cmd := exec.Command(name, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		code := 0
		if err := cmd.Run(); err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
		}
		return result{stdout.String(), stderr.String(), code}
	}
	head := run("git", "-C", repoRoot(t), "rev-parse", "--short=12", "HEAD")
	if head.code != 0 {
		t.Fatalf("git rev-parse HEAD in the repository: %s", head)
	}
	commit := strings.TrimSpace(head.stdout)
	expectResult(t, "gpu-deploy-guard --version", run(bin, "--version"), 0, "gpu-deploy-guard 0.1.0 (commit "+commit+")\n", "")
	expectResult(t, "kubectl gpu-deploy-guard --version", kubectlPlugin(t, "--version"), 0,
		"kubectl gpu-deploy-guard 0.1.0 (commit "+commit+")\n", "")

	dir := t.TempDir()
	for _, c := range []struct{ shell, marker string }{
		{"bash", "complete -F _gpu__deploy__guard"},
		{"zsh", "#compdef gpu-deploy-guard"},
		{"fish", "complete -c gpu-deploy-guard"},
	} {
		got := run(bin, "completion", c.shell)
		if got.code != 0 || got.stderr != "" || !strings.Contains(got.stdout, c.marker) ||
			!strings.Contains(got.stdout, "serve") || !strings.Contains(got.stdout, "completion") {
			t.Errorf("gpu-deploy-guard completion %s: exit %d, %d bytes, stderr %q; want the %s script", c.shell, got.code, len(got.stdout), got.stderr, c.shell)
			continue
		}
		script := filepath.Join(dir, "completion."+c.shell)
		if err := os.WriteFile(script, []byte(got.stdout), 0o644); err != nil {
			t.Fatal(err)
		}
		if c.shell == "bash" {
			// bash parses and loads it: the completion function exists afterwards.
			expectResult(t, "bash: source completion.bash; type -t _gpu__deploy__guard",
				run("bash", "-c", "source "+script+" && type -t _gpu__deploy__guard"), 0, "function\n", "")
		}
	}
	if got := run(bin, "completion", "powershell"); got.code != 2 || !strings.Contains(got.stderr, "powershell") {
		t.Errorf("gpu-deploy-guard completion powershell: %s\nwant exit 2 naming the value", got)
	}
}

// TestKubectlPluginPreviewsAClusterPolicyChange: `kubectl gpu-deploy-guard
// policy` reads the live ClusterPolicy and the nodes and says what the
// policy webhook would decide, before anything is sent: the toolkit switched
// off under the lab's device plugins is denied (exit 1) naming the nodes, the
// driver switched off is allowed with the nodes it leaves, and nothing is
// written either way.
func TestKubectlPluginPreviewsAClusterPolicyChange(t *testing.T) {
	setUpLab(t)
	installWatchedCRDs(t)
	t.Cleanup(func() {
		if got := kubectl("delete", "clusterpolicy", clusterPolicyName, "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	applyClusterPolicy(t, `{"toolkit":{"enabled":true},"driver":{"enabled":true}}`)
	before := cp.MustKubectl(t, "get", "clusterpolicy", clusterPolicyName, "-o", "jsonpath={.metadata.resourceVersion}")

	got := kubectlPlugin(t, "policy", "clusterpolicy", clusterPolicyName, "--patch", `{"spec":{"toolkit":{"enabled":false}}}`)
	if got.code != 1 || !strings.HasPrefix(got.stdout, "ClusterPolicy/cluster-policy UPDATE: denied (decided over 3 nodes)\n"+
		"  deny  toolkit-switched-off: ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet "+
		"while the NVIDIA device plugin keeps running on 2 nodes (lab-node-0, lab-node-1)") {
		t.Errorf("policy preview of toolkit.enabled=false: want exit 1, denied naming lab-node-0 and lab-node-1; got %s", got)
	}
	got = kubectlPlugin(t, "policy", "clusterpolicy", clusterPolicyName, "--patch", `{"spec":{"driver":{"enabled":false}}}`, "-o", "json")
	if got.code != 0 || !strings.Contains(got.stdout, `"decision": "allowed"`) ||
		!strings.Contains(got.stdout, `"ClusterPolicy cluster-policy: 1 node loses the driver DaemonSet (lab-node-0)"`) {
		t.Errorf("policy preview of driver.enabled=false: want exit 0, allowed with the driver warning for lab-node-0; got %s", got)
	}
	if after := cp.MustKubectl(t, "get", "clusterpolicy", clusterPolicyName, "-o", "jsonpath={.metadata.resourceVersion}"); after != before {
		t.Errorf("a preview wrote the ClusterPolicy: resourceVersion %s -> %s", before, after)
	}
	got = kubectlPlugin(t, "policy", "clusterpolicy", "no-such-policy", "--patch", `{}`)
	if got.code != 2 || !strings.Contains(got.stderr, "ClusterPolicy no-such-policy does not exist") {
		t.Errorf("policy preview of a missing ClusterPolicy: want exit 2 naming it; got %s", got)
	}
	// A GPUCluster is previewed too: beside the ClusterPolicy it is the conflict the
	// webhook refuses, and nothing is created.
	gc := filepath.Join(t.TempDir(), "gpu-cluster.yaml")
	if err := os.WriteFile(gc, []byte("apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: gpu-cluster\nspec: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got = kubectlPlugin(t, "policy", "-f", gc)
	if got.code != 1 || !strings.HasPrefix(got.stdout, "GPUCluster/gpu-cluster CREATE: denied") ||
		!strings.Contains(got.stdout, "GPUCluster gpu-cluster: ClusterPolicy cluster-policy exists") {
		t.Errorf("policy preview of a GPUCluster beside the ClusterPolicy: want exit 1, the conflict; got %s", got)
	}
	if out := cp.MustKubectl(t, "get", "gpuclusters", "-o", "name"); out != "" {
		t.Errorf("a preview created %s", out)
	}
}
