// Command playground runs the e2e lab for people to try: a local control
// plane, `gpu-deploy-guard serve` registered with the ValidatingWebhookConfiguration
// from deploy/ (clientConfig pointed at 127.0.0.1), and the lab's three
// nodes and five GPU Operator DaemonSets. It writes a kubeconfig and a pid
// file into -dir, prints a line starting with "ready" and instructions, and
// runs until SIGTERM or SIGINT. `make playground` / `make playground-down`
// drive it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

func main() {
	dir := flag.String("dir", ".playground", "runtime directory: kubeconfig, pid file, control-plane data and logs")
	bin := flag.String("bin", os.Getenv("GDG_BIN"), "gpu-deploy-guard binary (default $GDG_BIN)")
	flag.Parse()
	if err := run(*dir, *bin); err != nil {
		fmt.Fprintf(os.Stderr, "playground: %v\n", err)
		os.Exit(1)
	}
}

func run(dir, bin string) error {
	if bin == "" {
		return errors.New("no gpu-deploy-guard binary: pass -bin or set GDG_BIN")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	pidFile := filepath.Join(dir, "playground.pid")
	if pid, alive := runningPid(pidFile); alive {
		return fmt.Errorf("already running as pid %d (%s); stop it first", pid, pidFile)
	}
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	binDir, kubectl, err := framework.ResolveBinaries()
	if err != nil {
		return err
	}
	// A fresh cluster every time: etcd data from a previous run would
	// describe certificates and ports that no longer exist.
	clusterDir := filepath.Join(dir, "cluster")
	if err := os.RemoveAll(clusterDir); err != nil {
		return err
	}
	cp, err := framework.Start(framework.Config{BinDir: binDir, Kubectl: kubectl, WorkDir: clusterDir})
	if err != nil {
		if cp != nil {
			cp.DumpLogs(os.Stderr, 50)
		}
		return fmt.Errorf("control plane: %w", err)
	}
	defer cp.Stop()

	guardDir := filepath.Join(dir, "guard")
	if err := os.RemoveAll(guardDir); err != nil { // new certificates every time
		return err
	}
	configFile, err := cp.WriteShippedGuardConfig(root, guardDir)
	if err != nil {
		return err
	}
	// The webhook watches the playground's cluster as the chart's pods do:
	// deploy/base's service account and RBAC, a token of that account, the
	// operator's CRDs (stand-ins) and the report's.
	testdata := filepath.Join(root, "tests", "e2e", "testdata")
	if _, stderr, code := cp.Kubectl("apply", "-f", filepath.Join(testdata, "watched-crds.yaml")); code != 0 {
		return fmt.Errorf("kubectl apply -f watched-crds.yaml: exit %d: %s", code, stderr)
	}
	if err := cp.WaitCRDsEstablished(60*time.Second, "clusterpolicies.nvidia.com", "nvidiadrivers.nvidia.com",
		"gpuclusters.nvidia.com", "clusterpolicyreports.wgpolicyk8s.io"); err != nil {
		return fmt.Errorf("the watched CRDs are not established: %w", err)
	}
	// deploy/base's Role for the operand DaemonSets lives in the operator's namespace.
	if _, stderr, code := cp.Kubectl("create", "namespace", "gpu-operator"); code != 0 {
		return fmt.Errorf("kubectl create namespace gpu-operator: %s", stderr)
	}
	watchKubeconfig, err := serviceAccountKubeconfig(cp, root)
	if err != nil {
		return err
	}
	guard, err := framework.StartGuard(framework.GuardConfig{Bin: bin, Dir: guardDir, LogDir: cp.LogDir, ConfigFile: configFile,
		Env:       []string{"KUBECONFIG=" + watchKubeconfig, "POD_NAME=gpu-deploy-guard-playground", "POD_NAMESPACE=" + guardNamespace},
		ExtraArgs: []string{"--report"}})
	if guard != nil {
		cp.AddCleanup(guard.Stop)
	}
	if err != nil {
		return fmt.Errorf("gpu-deploy-guard: %w", err)
	}
	if err := cp.RegisterGuard(root, guard); err != nil {
		return err
	}
	for _, f := range []string{"gpu-operator-daemonsets.yaml", "gpu-operator-rbac.yaml", "lab-nodes.yaml"} {
		if _, stderr, code := cp.Kubectl("apply", "-f", filepath.Join(testdata, f)); code != 0 {
			return fmt.Errorf("kubectl apply -f %s: exit %d: %s", f, code, stderr)
		}
	}
	// What Node Feature Discovery says of a node with an NVIDIA PCI device: the
	// operator's labelling pass keeps the deploy labels of lab-node-0 and
	// lab-node-1 only with it, so a ClusterPolicy decision sees their operands.
	if _, stderr, code := cp.Kubectl("label", "node", "lab-node-0", "lab-node-1",
		"feature.node.kubernetes.io/pci-10de.present=true"); code != 0 {
		return fmt.Errorf("kubectl label node lab-node-0 lab-node-1 pci-10de.present=true: %s", stderr)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	data, err := os.ReadFile(cp.KubeconfigPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(kubeconfig, data, 0o600); err != nil {
		return err
	}
	// Its server is gone once this returns.
	defer os.Remove(kubeconfig)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	fmt.Print(instructions(os.Getpid(), kubeconfig, kubectl, bin, guard, cp.LogDir))
	s := <-sigs
	fmt.Printf("playground: %v: stopping\n", s)
	return nil
}

// The namespace of deploy/base: the webhook's service account and its Lease.
const guardNamespace = "gpu-deploy-guard"

// serviceAccountKubeconfig applies deploy/base's Namespace, ServiceAccount and
// RBAC and returns a kubeconfig with a token of that account, once RBAC lets
// it watch the nodes.
func serviceAccountKubeconfig(cp *framework.ControlPlane, root string) (string, error) {
	objs, err := cp.Kustomize(filepath.Join(root, "deploy", "base"))
	if err != nil {
		return "", err
	}
	for _, o := range objs {
		switch o.Kind {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if _, stderr, code := cp.KubectlWithInput(string(o.YAML), "apply", "-f", "-"); code != 0 {
				return "", fmt.Errorf("kubectl apply of deploy/base's %s: %s", o.Kind, stderr)
			}
		}
	}
	token, stderr, code := cp.Kubectl("create", "token", "gpu-deploy-guard", "-n", guardNamespace, "--duration=24h")
	if code != 0 {
		return "", fmt.Errorf("kubectl create token: %s", stderr)
	}
	kubeconfig, err := cp.WriteTokenKubeconfig("gpu-deploy-guard-playground", strings.TrimSpace(token))
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		answer, _, code := cp.KubectlAs(kubeconfig, "", "auth", "can-i", "watch", "nodes")
		if code == 0 {
			return kubeconfig, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the webhook's service account cannot watch nodes after 30s: %s", strings.TrimSpace(answer))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runningPid reads a pid file and reports whether that process still exists.
func runningPid(pidFile string) (int, bool) {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, syscall.Kill(pid, 0) == nil
}

func instructions(pid int, kubeconfig, kubectl, bin string, g *framework.Guard, logDir string) string {
	return fmt.Sprintf(`ready: gpu-deploy-guard playground running (pid %d)

Try it (kubectl 1.27 or newer; this one is known to work: %s):

  export KUBECONFIG=%s
  kubectl get nodes -L nvidia.com/gpu.deploy.container-toolkit,nvidia.com/gpu.deploy.device-plugin
  kubectl -n gpu-operator get daemonsets

  # the GPU policy, decided over every node the webhook watches
  kubectl apply -f tests/e2e/testdata/policy-clusterpolicy.yaml
  # refused, naming the nodes whose device plugins would lose their toolkit
  kubectl patch clusterpolicy cluster-policy --type merge -p '{"spec":{"toolkit":{"enabled":false}}}'

  # refused: the device plugin without the container toolkit
  kubectl label node lab-node-2 nvidia.com/gpu.deploy.device-plugin=true
  kubectl label node lab-node-0 nvidia.com/gpu.deploy.container-toolkit-
  # allowed
  kubectl label node lab-node-1 nvidia.com/gpu.deploy.dcgm-exporter=false --overwrite
  kubectl label node lab-node-0 nvidia.com/gpu.deploy.device-plugin=false nvidia.com/gpu.deploy.container-toolkit=false --overwrite
  # allowed for the operator's service account (audited, not judged)
  kubectl label node lab-node-2 nvidia.com/gpu.deploy.device-plugin=true --as=system:serviceaccount:gpu-operator:gpu-operator

  # what every node runs now, and the continuous audit's report
  %s audit
  kubectl get clusterpolicyreport gpu-deploy-guard -o jsonpath='{.summary}{"\n"}'

Webhook: %s (metrics: curl -s %s/metrics | grep admission_reviews)
Logs:    %s
Stop:    make playground-down
`, pid, kubectl, kubeconfig, bin, g.URL(), g.AdminURL(), logDir)
}
