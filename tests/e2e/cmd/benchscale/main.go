// Command benchscale measures `gpu-deploy-guard serve` and `audit` at fleet
// size (issue 18, "Fleet scale"). It starts the e2e control plane (etcd and
// kube-apiserver only: no controllers, which would fight it), fills it with
// N nodes of the large-node shape (benches/fixtures/large-node.json: ~100
// labels, 50 images, conditions; the lab's five deploy labels, all true,
// and the lab's NVIDIA GPU labels) and, for each node, one Running pod of
// each of the five operand DaemonSets of the lab (tests/e2e/testdata),
// owned by its DaemonSet (controller ownerReference) and bound to the node.
// It creates the objects itself, with -workers concurrent client-go
// workers, and sets the pods Running through the status subresource.
//
// Then, per N (ascending; the fleet grows between them), it starts
// -replicas `serve` processes as the Helm chart's Deployment runs them (its
// args, with the chart's default values; as the chart's service account
// with deploy/base's RBAC, rendered from the chart), and reports per
// replica: time to /readyz, peak RSS after the first sync and RSS once
// quiet, /metrics bytes on the clean fleet, CPU over a quiet window, CPU
// under N/300 node status heartbeats per second (the kubelet's 5-minute
// status report) and the peak RSS after them; then `audit` of the cluster:
// wall time and peak RSS (wait4's rusage). One table per N on standard
// output, and results.json and results.tsv in -out.
//
// `make bench-scale` runs it (SCALE_NODES=1000,5000,10000 by default).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"gpu-deploy-guard/tests/e2e/framework"
)

type options struct {
	bin           string
	nodes         []int
	replicas      int
	workers       int
	fixture       string
	out           string
	quiet         time.Duration
	heartbeat     time.Duration
	hbPeriod      time.Duration
	settleMin     time.Duration
	settleMax     time.Duration
	readyTimeout  time.Duration
	leaderMetric  string
	admin         bool
	etcdQuota     int64
	note          string
	auditTimeout  time.Duration
	hbWorkers     int
	apiInflight   int
	apiMutInflght int
	env           envList
	crFlood       int
	crBytes       int
	broken        bool
	taintEvery    int
}

// envList is a repeatable -env KEY=VALUE flag.
type envList []string

func (e *envList) String() string { return strings.Join(*e, " ") }
func (e *envList) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("%q is not KEY=VALUE", v)
	}
	*e = append(*e, v)
	return nil
}

func main() {
	var o options
	nodes := flag.String("nodes", "1000,5000,10000", "fleet sizes, ascending, comma-separated")
	flag.StringVar(&o.bin, "bin", os.Getenv("GDG_BIN"), "gpu-deploy-guard binary (default $GDG_BIN)")
	flag.IntVar(&o.replicas, "replicas", 2, "serve processes (the chart's default replicaCount); 0: no serve, no audit")
	flag.IntVar(&o.workers, "workers", 32, "concurrent workers creating the fleet")
	flag.StringVar(&o.fixture, "fixture", "benches/fixtures/large-node.json", "node shape (relative to the repository root)")
	flag.StringVar(&o.out, "out", "target/bench-scale", "results.json, results.tsv, logs (relative to the repository root)")
	flag.DurationVar(&o.quiet, "quiet", 60*time.Second, "quiet window for CPU at rest")
	flag.DurationVar(&o.heartbeat, "heartbeat", 60*time.Second, "how long to send node status heartbeats")
	flag.DurationVar(&o.hbPeriod, "heartbeat-period", 5*time.Minute, "each node's status report period: the rate is N/period")
	flag.IntVar(&o.hbWorkers, "heartbeat-workers", 8, "concurrent heartbeat PATCHes at most")
	flag.DurationVar(&o.settleMin, "settle-min", 10*time.Second, "after /readyz, wait at least this long for the replicas to go quiet")
	flag.DurationVar(&o.settleMax, "settle-max", 3*time.Minute, "and at most this long")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 10*time.Minute, "bound on serve's time to /readyz")
	flag.DurationVar(&o.auditTimeout, "audit-timeout", 10*time.Minute, "bound on one audit run")
	flag.StringVar(&o.leaderMetric, "leader-metric", "gpu_deploy_guard_audit_leader",
		"gauge that is 1 on the replica that runs the continuous audit (reported when present)")
	flag.BoolVar(&o.admin, "admin-kubeconfig", false, "run serve and audit with the admin kubeconfig instead of the chart's service account")
	flag.Int64Var(&o.etcdQuota, "etcd-quota", 8<<30, "etcd --quota-backend-bytes")
	flag.IntVar(&o.apiInflight, "max-requests-inflight", 1600, "kube-apiserver --max-requests-inflight")
	flag.IntVar(&o.apiMutInflght, "max-mutating-requests-inflight", 800, "kube-apiserver --max-mutating-requests-inflight")
	flag.StringVar(&o.note, "note", "", "machine note recorded with the results")
	flag.BoolVar(&o.broken, "broken", false, "a broken fleet: every node's container toolkit pod stays Pending under its Running device plugin, so every node has a failing finding (an operator upgrade gone wrong)")
	flag.IntVar(&o.taintEvery, "taint-every", 10, "every Nth node carries the NoSchedule quarantine taint nvidia.com/gpu-xid-error=79 the operands do not tolerate (a tenth by default); 0: none")
	flag.IntVar(&o.crFlood, "cr-flood", 40, "after the heartbeats, create this many large NVIDIADrivers (and a sixth as many ClusterPolicies), then delete them; 0: no flood")
	flag.IntVar(&o.crBytes, "cr-bytes", 1000000, "bytes of an unread field in each flood object")
	flag.Var(&o.env, "env", "KEY=VALUE added to serve's environment (repeatable), e.g. what a newer chart passes")
	flag.Parse()
	for _, s := range strings.Split(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "benchscale: bad -nodes entry %q\n", s)
			os.Exit(2)
		}
		o.nodes = append(o.nodes, n)
	}
	sort.Ints(o.nodes)
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "benchscale:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s benchscale: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(o options) error {
	// -replicas 0 without a binary: the fleet, the heartbeats and the
	// control plane's figures only (to try the harness).
	if o.bin == "" && o.replicas > 0 {
		return errors.New("no gpu-deploy-guard binary: pass -bin or set GDG_BIN")
	}
	bin := ""
	if o.bin != "" {
		var err error
		if bin, err = filepath.Abs(o.bin); err != nil {
			return err
		}
	}
	o.bin = bin
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(root, p)
	}
	out := abs(o.out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	binDir, kubectl, err := framework.ResolveBinaries()
	if err != nil {
		return err
	}
	version, digest := "no binary", ""
	if bin != "" {
		if version, err = productVersion(bin); err != nil {
			return err
		}
		// --version names the commit, not whether the tree was clean.
		if digest, err = sha256File(bin); err != nil {
			return err
		}
	}
	template, fixtureBytes, err := loadNodeTemplate(abs(o.fixture))
	if err != nil {
		return err
	}

	clusterDir := filepath.Join(out, "cluster")
	if err := os.RemoveAll(clusterDir); err != nil {
		return err
	}
	cp, err := framework.Start(framework.Config{
		BinDir: binDir, Kubectl: kubectl, WorkDir: clusterDir,
		NoControllerManager: true,
		// 10,000 nodes and 50,000 pods measured 596 MiB of etcd database
		// (the bbolt file does not shrink after compaction without a
		// defrag): etcd's default 2 GiB quota holds it, with less room than
		// a run that grows further or heartbeats longer needs.
		ExtraEtcdArgs: []string{"--quota-backend-bytes=" + strconv.FormatInt(o.etcdQuota, 10)},
		ExtraAPIServerArgs: []string{
			"--max-requests-inflight=" + strconv.Itoa(o.apiInflight),
			"--max-mutating-requests-inflight=" + strconv.Itoa(o.apiMutInflght),
		},
		Logf: logf,
	})
	if err != nil {
		if cp != nil {
			cp.DumpLogs(os.Stderr, 50)
		}
		return fmt.Errorf("control plane: %w", err)
	}
	defer func() {
		cp.Stop()
		// Logs stay; etcd's data (a GiB at 10,000 nodes) does not.
		_ = os.RemoveAll(filepath.Join(clusterDir, "etcd-data"))
	}()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		logf("%v: stopping", s)
		cancel()
	}()

	restCfg, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = -1, 0 // no client-side rate limit
	restCfg.ContentType = "application/vnd.kubernetes.protobuf"
	restCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}

	s, err := setUp(ctx, cp, cs, root, bin, o.admin)
	if err != nil {
		return err
	}
	f := &fleet{cs: cs, template: template, dsets: s.dsets, workers: o.workers, logf: logf, broken: o.broken, taintEvery: o.taintEvery}

	res := results{
		Date: time.Now().UTC().Format(time.RFC3339), Binary: bin, Version: version, SHA256: digest, Note: o.note,
		Replicas: o.replicas, Fixture: o.fixture, FixtureBytes: fixtureBytes, Kubeconfig: s.identity,
		QuietSeconds: o.quiet.Seconds(), HeartbeatSeconds: o.heartbeat.Seconds(), HeartbeatPeriod: o.hbPeriod.Seconds(),
		LeaderMetric: o.leaderMetric, EtcdQuota: o.etcdQuota, Machine: machine(), Broken: o.broken, TaintEvery: o.taintEvery,
	}
	for _, n := range o.nodes {
		logf("N=%d: growing the fleet from %d nodes", n, f.nodes)
		fill, err := f.grow(ctx, n)
		if err != nil {
			return err
		}
		logf("N=%d: created %d nodes and %d Running pods in %.1f s", n, fill.Nodes, fill.Pods, fill.Seconds)
		r, err := measure(ctx, o, cp, cs, s, f, n)
		r.Fill = fill
		if err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
		res.Runs = append(res.Runs, r)
		fmt.Print(table(res, r))
		if err := res.write(out); err != nil {
			return err
		}
	}
	logf("results in %s/results.json and results.tsv", out)
	return nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func productVersion(bin string) (string, error) {
	cmdOut, err := execOutput(bin, "--version")
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	return strings.TrimSpace(cmdOut), nil
}

// setup is what every N shares: the operand DaemonSets, the guard's
// kubeconfig and config file.
type setup struct {
	dsets      []appsv1.DaemonSet
	kubeconfig string
	identity   string
	config     string
	// review is a node AdmissionReview the replicas allow (the large node,
	// one label changed), for the latency probe.
	review []byte
}

func setUp(ctx context.Context, cp *framework.ControlPlane, cs *kubernetes.Clientset, root, bin string, admin bool) (*setup, error) {
	testdata := filepath.Join(root, "tests", "e2e", "testdata")
	for _, f := range []string{"gpu-operator-daemonsets.yaml", "watched-crds.yaml"} {
		if _, stderr, code := cp.Kubectl("apply", "-f", filepath.Join(testdata, f)); code != 0 {
			return nil, fmt.Errorf("kubectl apply -f %s: exit %d: %s", f, code, stderr)
		}
	}
	if err := cp.WaitCRDsEstablished(60*time.Second, "clusterpolicies.nvidia.com", "clusterpolicyreports.wgpolicyk8s.io"); err != nil {
		return nil, err
	}
	// No serviceaccount-controller: the pods' "default" service account,
	// which the ServiceAccount admission plugin insists on, is made here.
	if _, stderr, code := cp.Kubectl("create", "serviceaccount", "default", "-n", operatorNS); code != 0 {
		return nil, fmt.Errorf("kubectl create serviceaccount default: %s", stderr)
	}
	list, err := cs.AppsV1().DaemonSets(operatorNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	if len(list.Items) != len(labDeployLabels) {
		return nil, fmt.Errorf("%d DaemonSets in %s, want %d", len(list.Items), operatorNS, len(labDeployLabels))
	}
	// The toleration every operand asset of the GPU Operator carries: the
	// fixture's nodes are tainted nvidia.com/gpu=present:NoSchedule as GPU
	// node pools often are, and only the -taint-every nodes should hold
	// operands off.
	for i := range list.Items {
		ds := &list.Items[i]
		ds.Spec.Template.Spec.Tolerations = append(ds.Spec.Template.Spec.Tolerations, corev1.Toleration{
			Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
		updated, err := cs.AppsV1().DaemonSets(operatorNS).Update(ctx, ds, metav1.UpdateOptions{})
		if err != nil {
			return nil, fmt.Errorf("adding the operator's toleration to %s: %w", ds.Name, err)
		}
		list.Items[i] = *updated
	}
	s := &setup{dsets: list.Items}
	if s.review, err = os.ReadFile(filepath.Join(root, "benches", "fixtures", "large-node-review-allowed.json")); err != nil {
		return nil, err
	}

	guardDir := filepath.Join(cp.Dir, "guard")
	if s.config, err = cp.WriteShippedGuardConfig(root, guardDir); err != nil {
		return nil, err
	}
	// The guard's namespace, service account and RBAC exist either way
	// (a Lease of the guard's lives in that namespace).
	saKubeconfig, err := serviceAccountKubeconfig(cp, root)
	if err != nil {
		return nil, err
	}
	if admin {
		s.kubeconfig, s.identity = cp.KubeconfigPath, "admin (system:masters)"
		return s, nil
	}
	s.kubeconfig = saKubeconfig
	s.identity = "system:serviceaccount:gpu-deploy-guard:gpu-deploy-guard (deploy/base RBAC, rendered from the chart)"
	return s, nil
}

// serviceAccountKubeconfig applies deploy/base's Namespace, ServiceAccount
// and RBAC (the chart's rbac.yaml, rendered) and returns a kubeconfig with a
// token of that service account, once RBAC lets it watch what serve does.
func serviceAccountKubeconfig(cp *framework.ControlPlane, root string) (string, error) {
	objs, err := cp.Kustomize(filepath.Join(root, "deploy", "base"))
	if err != nil {
		return "", err
	}
	n := 0
	for _, o := range objs {
		switch o.Kind {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if _, stderr, code := cp.KubectlWithInput(string(o.YAML), "apply", "-f", "-"); code != 0 {
				return "", fmt.Errorf("kubectl apply of deploy/base's %s %s: %s", o.Kind, o.Name, stderr)
			}
			n++
		}
	}
	if n < 6 {
		return "", fmt.Errorf("deploy/base has %d Namespace/ServiceAccount/RBAC objects, want at least 6", n)
	}
	const ns, sa = "gpu-deploy-guard", "gpu-deploy-guard"
	token, stderr, code := cp.Kubectl("create", "token", sa, "-n", ns, "--duration=12h")
	if code != 0 {
		return "", fmt.Errorf("kubectl create token: %s", stderr)
	}
	kubeconfig, err := cp.WriteTokenKubeconfig("gpu-deploy-guard-sa", strings.TrimSpace(token))
	if err != nil {
		return "", err
	}
	checks := [][]string{
		{"watch", "pods", "-n", operatorNS}, {"watch", "daemonsets", "-n", operatorNS},
		{"watch", "deployments", "-n", operatorNS}, {"watch", "nodes"}, {"watch", "clusterpolicies.nvidia.com"},
	}
	return kubeconfig, framework.Poll(30*time.Second, func() (bool, string) {
		for _, c := range checks {
			answer, _, code := cp.KubectlAs(kubeconfig, "", append([]string{"auth", "can-i"}, c...)...)
			if code != 0 {
				return false, "can-i " + strings.Join(c, " ") + ": " + strings.TrimSpace(answer)
			}
		}
		return true, ""
	})
}

// startReplicas starts the serve processes together, as a fresh
// Deployment's pods start, with the chart's args.
func startReplicas(cp *framework.ControlPlane, o options, s *setup, bin string, n int) ([]*framework.Guard, error) {
	guards := make([]*framework.Guard, o.replicas)
	errs := make([]error, o.replicas)
	var wg sync.WaitGroup
	for i := range guards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("gpu-deploy-guard-n%d-%d", n, i)
			g, err := framework.StartGuard(framework.GuardConfig{
				Bin: bin, Dir: filepath.Join(cp.Dir, name), LogDir: cp.LogDir, ConfigFile: s.config,
				Name: name, ReadyTimeout: o.readyTimeout,
				// The chart: RUST_LOG from log.level, --log-format from
				// log.format; the pod's name and namespace as the downward
				// API gives them (a replica's identity in a Lease).
				Env: append([]string{"KUBECONFIG=" + s.kubeconfig, "RUST_LOG=info",
					"POD_NAME=" + name, "POD_NAMESPACE=gpu-deploy-guard"}, o.env...),
				ExtraArgs: []string{"--log-format=json"},
			})
			guards[i], errs[i] = g, err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, g := range guards {
				if g != nil {
					g.Stop()
				}
			}
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
	}
	return guards, nil
}
