// Command apilatency measures, through a real kube-apiserver, how long a
// label PATCH on a Node takes with no admission, with gpu-deploy-guard's
// webhook (deploy/base's ValidatingWebhookConfiguration, clientConfig on
// loopback) and with the CEL ValidatingAdmissionPolicy of deploy/cel, in one
// run, interleaved. Before measuring it checks that the webhook and the CEL
// policy decide the lab's label changes alike.
//
//	GDG_BIN=target/release/gpu-deploy-guard tests/e2e/apilatency.sh [-smoke]
//
// How modes are switched, and why: only one mechanism is registered at a
// time. Between modes everything is unregistered, a dry-run probe that both
// mechanisms refuse must pass (nothing active), then the next mode's objects
// are created and the probe must be refused by that mechanism (it is
// active). Each mode therefore measures exactly the shipped objects, on the
// same node, with the same patch, by the same user. Keeping all three
// registered and steering requests by node or label would need a selector
// added to the shipped objects (not what users run), and the CEL policy
// matches every Node update by a person, so it could not be kept out of the
// webhook's requests. Rounds run the modes in all six orders in turn, so
// each mode is measured as often early and late in a round, and next to
// each other mode; slow drift of a busy machine hits all modes alike.
//
// -variants adds webhook modes with a changed configuration (no
// matchConditions, one webhook, a file), a serve process on a non-loopback
// address (the API server speaks HTTP/2 only to loopback URLs; to a Service,
// as in a cluster, HTTP/1.1) or with other settings, measured in the same
// rounds: k modes run in the k rotations of their list and of its reverse.
// Each variant must decide the lab like the shipped webhook. The report then
// adds a comparison paired by round, more of the API server's admission
// metrics, connections, and the CPU time of each process per PATCH.
// -node-labels and -node-images make the bench node kubelet-sized; -gap
// pauses before each measured PATCH.
//
// The change "noop" points the variant's configuration at a no-op webhook
// instead of serve: an HTTPS server in this program (Go's net/http, the
// same certificate) that reads the review, takes its uid and answers
// allowed at once. The same configuration with its two webhooks and
// matchConditions then costs the API server what any webhook costs it, so
// that serve's own cost is the difference: "ours − no-op", paired by round.
//
// Exit status: 0 after printing the table (whether or not the targets are
// met: the table says so), 1 when anything fails (a PATCH, a probe, the
// decisions disagreeing).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"gpu-deploy-guard/tests/e2e/framework"
)

const (
	deployPrefix = "nvidia.com/gpu.deploy."
	// benchNode carries the whole stack; flipping its DCGM exporter is
	// allowed by both mechanisms, and setting its toolkit to false (the
	// probe) is refused by both.
	benchNode = "latency-node"
	// The exact openings of each mechanism's refusal, as the API server
	// words them.
	webhookDenied = `admission webhook "enforce.gpu-deploy-guard.io" denied the request: `
	celDenied     = `ValidatingAdmissionPolicy 'gpu-deploy-guard-device-plugin-needs-toolkit' with binding ` +
		`'gpu-deploy-guard-device-plugin-needs-toolkit' denied request: `
)

// mechanism is what answers the probe: nothing, a webhook, the CEL policy.
type mechanism int

const (
	noMechanism mechanism = iota
	webhookMechanism
	celMechanism
	noopMechanism
)

// mode is an index into variants: the three modes every run measures, then
// the -variants, in the order given.
type mode int

const (
	none mode = iota
	webhook
	cel
)

var modes = []mode{none, webhook, cel}

// variant is one measured mode: which mechanism, and for webhook modes the
// configuration registered and the serve process it points at.
type variant struct {
	name  string
	mech  mechanism
	vwc   *admissionregistrationv1.ValidatingWebhookConfiguration
	guard *framework.Guard
	// noop answers instead of guard for a "noop" variant.
	noop *noopWebhook
	// spec is the -variants entry; about says what it changes.
	spec, about string
}

var variants = []variant{
	{name: "no admission", mech: noMechanism},
	{name: "gpu-deploy-guard webhook", mech: webhookMechanism},
	{name: "CEL ValidatingAdmissionPolicy", mech: celMechanism},
}

func (m mode) String() string { return variants[m].name }

func (m mode) mech() mechanism { return variants[m].mech }

type options struct {
	rounds, perRound, warmup int
	bin                      string
	smoke                    bool
	variants                 string
	hostIP                   string
	gap                      time.Duration
	nodeLabels, nodeImages   int
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 36, "rounds; each measures every mode once, in the next of the six orders")
	flag.IntVar(&o.perRound, "n", 40, "measured PATCHes per mode per round")
	flag.IntVar(&o.warmup, "warmup", 100, "unmeasured PATCHes per mode before the first round")
	flag.StringVar(&o.bin, "bin", os.Getenv("GDG_BIN"), "gpu-deploy-guard binary (default $GDG_BIN)")
	flag.BoolVar(&o.smoke, "smoke", false, "a tiny run for CI: 2 rounds of 5 PATCHes per mode, 10 warm-up")
	flag.StringVar(&o.variants, "variants", "", "extra webhook modes, comma-separated; each is a +-joined list of changes to "+
		"the shipped configuration: nomc (no matchConditions), enforce (the enforce webhook only), http1 (serve on a "+
		"non-loopback address: the API server then speaks HTTP/1.1, as it does to a Service), tokio1 (serve with "+
		"TOKIO_WORKER_THREADS=1), idle=DURATION (serve --idle-timeout DURATION: with -gap above it, "+
		"every review opens a new connection, as all did before serve kept idle connections for 120 s), "+
		"file=PATH (a ValidatingWebhookConfiguration of service clientConfigs instead of deploy/base's); "+
		"e.g. -variants nomc,enforce,enforce+nomc,http1,noop+http1")
	flag.IntVar(&o.nodeLabels, "node-labels", 0, "extra labels on the bench node (a GPU node carries dozens from feature discovery)")
	flag.IntVar(&o.nodeImages, "node-images", 0, "images in the bench node's status (a kubelet reports up to 50), with the usual conditions")
	flag.DurationVar(&o.gap, "gap", 0, "pause before each measured PATCH (e.g. longer than a variant's idle=)")
	flag.StringVar(&o.hostIP, "host-ip", "", "the non-loopback address for http1 (default: the first global IPv4 address)")
	flag.Parse()
	if o.smoke {
		o.rounds, o.perRound, o.warmup = 2, 5, 10
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "apilatency: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "apilatency: "+format+"\n", args...)
}

func run(o options) error {
	if o.bin == "" {
		return errors.New("no gpu-deploy-guard binary: set GDG_BIN or pass -bin")
	}
	if o.rounds < 1 || o.perRound < 1 || o.warmup < 0 {
		return errors.New("-rounds and -n must be at least 1, -warmup at least 0")
	}
	started := time.Now()
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	binDir, kubectl, err := framework.ResolveBinaries()
	if err != nil {
		return err
	}
	// No kube-scheduler or kwok: kwok's Lease renewals and the watches of
	// both are load that has nothing to do with node PATCHes. Nothing here
	// needs pods.
	cp, err := framework.Start(framework.Config{BinDir: binDir, Kubectl: kubectl, NoScheduling: true,
		Logf: func(f string, a ...any) { logf(f, a...) }})
	if err != nil {
		if cp != nil {
			cp.DumpLogs(os.Stderr, 50)
			cp.Stop()
		}
		return fmt.Errorf("control plane: %w", err)
	}
	failed := true
	defer func() {
		if failed {
			cp.DumpLogs(os.Stderr, 40)
		}
		cp.Stop()
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		logf("%v: stopping", s)
		cp.Stop()
		os.Exit(1)
	}()

	b, err := newBench(cp, root, o.bin)
	if err != nil {
		return err
	}
	if err := b.addVariants(o, root); err != nil {
		return err
	}
	if err := b.createNodes(root, o); err != nil {
		return err
	}
	if err := b.checkDecisions(); err != nil {
		return err
	}
	res, err := b.measure(o)
	if err != nil {
		return err
	}
	failed = false
	fmt.Print(report(o, res, started))
	return nil
}

// bench holds the clients and the objects of each mode.
type bench struct {
	cp *framework.ControlPlane
	// client registers objects, probes and checks decisions; measured only
	// sends the measured PATCHes (its Warning headers are counted).
	client, measured *kubernetes.Clientset
	guard            *framework.Guard
	vwc              *admissionregistrationv1.ValidatingWebhookConfiguration
	policy           *admissionregistrationv1.ValidatingAdmissionPolicy
	binding          *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	// warnings counts Warning headers on measured requests: an allowed flip
	// of the DCGM exporter should get none.
	warnings     atomic.Int64
	warningTexts countWarnings
}

// countWarnings counts Warning headers and keeps the distinct texts.
type countWarnings struct {
	n     *atomic.Int64
	mu    *sync.Mutex
	texts map[string]int
}

func (c countWarnings) HandleWarningHeader(code int, agent, text string) {
	c.n.Add(1)
	c.mu.Lock()
	c.texts[text]++
	c.mu.Unlock()
}

func newBench(cp *framework.ControlPlane, root, bin string) (*bench, error) {
	b := &bench{cp: cp}
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit: it would be measured too
	cfg.UserAgent = "gpu-deploy-guard-apilatency"
	cfg.WarningHandler = rest.NoWarnings{} // the probes and the lab cases draw warnings on purpose
	if b.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	b.warningTexts = countWarnings{n: &b.warnings, mu: &sync.Mutex{}, texts: map[string]int{}}
	cfg.WarningHandler = b.warningTexts
	if b.measured, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}

	// The webhook: the release binary with deploy/base's policy. No cluster
	// watch: that is background work on every node change, the same in
	// every mode, and not what an admission review costs.
	dir := filepath.Join(cp.Dir, "gpu-deploy-guard")
	configFile, err := cp.WriteShippedGuardConfig(root, dir)
	if err != nil {
		return nil, err
	}
	b.guard, err = framework.StartGuard(framework.GuardConfig{Bin: bin, Dir: dir, LogDir: cp.LogDir, ConfigFile: configFile,
		ExtraArgs: []string{"--no-cluster-watch"}})
	if b.guard != nil {
		cp.AddCleanup(b.guard.Stop)
	}
	if err != nil {
		return nil, fmt.Errorf("gpu-deploy-guard serve: %w", err)
	}
	shipped, err := cp.ShippedWebhookConfiguration(root)
	if err != nil {
		return nil, err
	}
	if b.vwc, err = framework.Loopback(shipped, b.guard.URL(), b.guard.CABundle); err != nil {
		return nil, err
	}
	variants[webhook].vwc, variants[webhook].guard = b.vwc, b.guard

	objs, err := cp.Kustomize(filepath.Join(root, "deploy", "cel"))
	if err != nil {
		return nil, err
	}
	// The Node policy and its binding: what a node label update meets. The
	// ClusterPolicy policy beside them matches no Node request.
	const nodePolicy = "gpu-deploy-guard-device-plugin-needs-toolkit"
	objs = slices.DeleteFunc(objs, func(o framework.Object) bool { return o.Name != nodePolicy })
	if len(objs) != 2 {
		return nil, fmt.Errorf("deploy/cel renders %d objects named %s, want the policy and its binding", len(objs), nodePolicy)
	}
	for _, o := range objs {
		switch o.Kind {
		case "ValidatingAdmissionPolicy":
			b.policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			err = yaml.UnmarshalStrict(o.YAML, b.policy)
		case "ValidatingAdmissionPolicyBinding":
			b.binding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			err = yaml.UnmarshalStrict(o.YAML, b.binding)
		default:
			err = fmt.Errorf("deploy/cel renders an unexpected %s", o.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("deploy/cel %s: %w", o.Kind, err)
		}
	}
	if b.policy == nil || b.binding == nil {
		return nil, errors.New("deploy/cel lacks the policy or its binding")
	}
	return b, nil
}

// addVariants parses -variants and appends one webhook mode per entry, each
// with the serve process it needs (one per distinct address and runtime;
// the shipped mode's process when nothing differs).
func (b *bench) addVariants(o options, root string) error {
	if strings.TrimSpace(o.variants) == "" {
		return nil
	}
	shipped, err := b.cp.ShippedWebhookConfiguration(root)
	if err != nil {
		return err
	}
	guards := map[string]*framework.Guard{"127.0.0.1": b.guard}
	noops := map[string]*noopWebhook{}
	for _, spec := range strings.Split(o.variants, ",") {
		spec = strings.TrimSpace(spec)
		if spec == "" {
			continue
		}
		source, ip, tokio1, name, idle := shipped, "127.0.0.1", false, spec, ""
		var keepEnforceOnly, noMatchConditions, noop bool
		var about []string
		for _, change := range strings.Split(spec, "+") {
			switch {
			case change == "nomc":
				noMatchConditions = true
				about = append(about, "no matchConditions")
			case change == "enforce":
				keepEnforceOnly = true
				about = append(about, "the enforce webhook only")
			case change == "http1":
				if ip = o.hostIP; ip == "" {
					if ip, err = firstGlobalIPv4(); err != nil {
						return fmt.Errorf("variant %s: %w", spec, err)
					}
				}
				about = append(about, "serve on "+ip+" (HTTP/1.1)")
			case strings.HasPrefix(change, "idle="):
				idle = strings.TrimPrefix(change, "idle=")
				if _, err := time.ParseDuration(idle); err != nil {
					return fmt.Errorf("variant %s: %w", spec, err)
				}
				about = append(about, "serve --idle-timeout "+idle)
			case change == "noop":
				noop = true
				about = append(about, "a no-op webhook answering allowed at once")
			case change == "tokio1":
				tokio1 = true
				about = append(about, "serve with TOKIO_WORKER_THREADS=1")
			case strings.HasPrefix(change, "file="):
				path := strings.TrimPrefix(change, "file=")
				data, err := os.ReadFile(path)
				if err != nil {
					return fmt.Errorf("variant %s: %w", spec, err)
				}
				source = &admissionregistrationv1.ValidatingWebhookConfiguration{}
				if err := yaml.UnmarshalStrict(data, source); err != nil {
					return fmt.Errorf("variant %s: %s: %w", spec, path, err)
				}
				if source.Name != shipped.Name {
					return fmt.Errorf("variant %s: %s names the configuration %q, not %q", spec, path, source.Name, shipped.Name)
				}
				name = strings.Replace(spec, change, filepath.Base(path), 1)
				about = append(about, path+" instead of deploy/base")
			default:
				return fmt.Errorf("variant %s: unknown change %q (want nomc, enforce, http1, noop, tokio1, idle=DURATION or file=PATH)", spec, change)
			}
		}
		key := ip
		if tokio1 {
			key += "/tokio1"
		}
		args := []string{"--no-cluster-watch"}
		if idle != "" {
			key += "/idle" + idle
			args = append(args, "--idle-timeout", idle)
		}
		g := guards[key]
		if g == nil {
			var env []string
			if tokio1 {
				env = []string{"TOKIO_WORKER_THREADS=1"}
			}
			dir := filepath.Join(b.cp.Dir, "gpu-deploy-guard-"+strings.NewReplacer(".", "-", "/", "-", ":", "-").Replace(key))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			configFile := filepath.Join(b.cp.Dir, "gpu-deploy-guard", "config.yaml")
			g, err = framework.StartGuard(framework.GuardConfig{Bin: b.guard.Bin, Dir: dir, LogDir: b.cp.LogDir, ConfigFile: configFile,
				Name: "gpu-deploy-guard-" + filepath.Base(dir), Env: env, IP: ip, ExtraArgs: args})
			if g != nil {
				b.cp.AddCleanup(g.Stop)
			}
			if err != nil {
				return fmt.Errorf("variant %s: gpu-deploy-guard serve: %w", spec, err)
			}
			guards[key] = g
		}
		url, mech := g.URL(), webhookMechanism
		var nw *noopWebhook
		if noop {
			if nw = noops[ip]; nw == nil {
				// serve's certificate for this address, which the CA bundle vouches for.
				if nw, err = startNoop(ip, filepath.Join(g.Dir, "certs")); err != nil {
					return fmt.Errorf("variant %s: %w", spec, err)
				}
				b.cp.AddCleanup(nw.stop)
				noops[ip] = nw
			}
			url, mech = nw.url(), noopMechanism
		}
		vwc, err := framework.Loopback(source, url, g.CABundle)
		if err != nil {
			return fmt.Errorf("variant %s: %w", spec, err)
		}
		if keepEnforceOnly {
			vwc.Webhooks = slices.DeleteFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
				return w.Name != "enforce.gpu-deploy-guard.io"
			})
			if len(vwc.Webhooks) != 1 {
				return fmt.Errorf("variant %s: no webhook enforce.gpu-deploy-guard.io", spec)
			}
		}
		if noMatchConditions {
			for i := range vwc.Webhooks {
				vwc.Webhooks[i].MatchConditions = nil
			}
		}
		modes = append(modes, mode(len(variants)))
		prefix := "webhook: "
		if noop {
			prefix = "no-op webhook: "
		}
		variants = append(variants, variant{name: prefix + name, mech: mech, vwc: vwc, guard: g, noop: nw,
			spec: spec, about: strings.Join(about, ", ")})
	}
	return nil
}

// firstGlobalIPv4 is an address of this machine that is not loopback.
func firstGlobalIPv4() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String(), nil
		}
	}
	return "", errors.New("no global IPv4 address to serve on; pass -host-ip")
}

// createNodes creates the lab's nodes, lab-node-3 (registered already
// broken: the device plugin without the toolkit, which no mechanism judges
// on CREATE) and the node the PATCHes go to.
func (b *bench) createNodes(root string, o options) error {
	data, err := os.ReadFile(filepath.Join(root, "tests", "e2e", "testdata", "lab-nodes.yaml"))
	if err != nil {
		return err
	}
	objs, err := framework.SplitManifests(data)
	if err != nil {
		return err
	}
	var nodes []*corev1.Node
	for _, o := range objs {
		n := &corev1.Node{}
		if err := yaml.UnmarshalStrict(o.YAML, n); err != nil {
			return fmt.Errorf("lab node %s: %w", o.Name, err)
		}
		nodes = append(nodes, n)
	}
	node := func(name string, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	nodes = append(nodes,
		node("lab-node-3", map[string]string{"kubernetes.io/hostname": "lab-node-3", deployPrefix + "device-plugin": "true"}),
		node(benchNode, map[string]string{
			"kubernetes.io/hostname":           benchNode,
			"nvidia.com/gpu.present":           "true",
			deployPrefix + "driver":            "true",
			deployPrefix + "container-toolkit": "true",
			deployPrefix + "device-plugin":     "true",
			deployPrefix + "dcgm-exporter":     "true",
		}))
	bench := nodes[len(nodes)-1]
	for i := 0; i < o.nodeLabels; i++ {
		bench.Labels[fmt.Sprintf("feature.node.kubernetes.io/bench-feature-%03d", i)] = "true"
	}
	for _, n := range nodes {
		if _, err := b.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", n.Name, err)
		}
	}
	if o.nodeImages > 0 {
		// What a kubelet reports: the images on the node, each by digest
		// and tag, and the usual conditions.
		n, err := b.client.CoreV1().Nodes().Get(context.Background(), benchNode, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := 0; i < o.nodeImages; i++ {
			name := fmt.Sprintf("registry.example.com/bench/operand-image-%03d", i)
			n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
				Names:     []string{fmt.Sprintf("%s@sha256:%064x", name, i+1), name + ":v25.3.1"},
				SizeBytes: int64(100_000_000 + i),
			})
		}
		now := metav1.Now()
		for _, c := range []corev1.NodeConditionType{"MemoryPressure", "DiskPressure", "PIDPressure", corev1.NodeReady} {
			status := corev1.ConditionFalse
			if c == corev1.NodeReady {
				status = corev1.ConditionTrue
			}
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: status,
				LastHeartbeatTime: now, LastTransitionTime: now, Reason: "Bench" + string(c), Message: "set by apilatency"})
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}, {Type: corev1.NodeHostName, Address: benchNode}}
		n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: "bench", SystemUUID: "bench", BootID: "bench", KernelVersion: "6.8.0",
			OSImage: "Ubuntu 24.04 LTS", ContainerRuntimeVersion: "containerd://1.7.0", KubeletVersion: "v1.34.12",
			OperatingSystem: "linux", Architecture: "amd64"}
		if _, err := b.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("status of node %s: %w", benchNode, err)
		}
	}
	if o.nodeLabels > 0 || o.nodeImages > 0 {
		n, err := b.client.CoreV1().Nodes().Get(context.Background(), benchNode, metav1.GetOptions{})
		if err != nil {
			return err
		}
		raw, _ := json.Marshal(n)
		logf("node %s: %d labels, %d images, %d bytes of JSON", benchNode, len(n.Labels), len(n.Status.Images), len(raw))
	}
	return nil
}

// patch is a JSON merge patch of node labels; a nil value removes the label.
func labelPatch(labels map[string]*string) []byte {
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	return body
}

func str(s string) *string { return &s }

func patch(ctx context.Context, client *kubernetes.Clientset, node string, body []byte, dryRun bool) error {
	req := client.CoreV1().RESTClient().Patch(types.MergePatchType).Resource("nodes").Name(node).Body(body)
	if dryRun {
		req = req.Param("dryRun", "All")
	}
	return req.Do(ctx).Error()
}

// probe is a dry run that both mechanisms refuse: the toolkit switched off
// under the bench node's device plugin. It tells which one is active.
func (b *bench) probe() (mechanism, error) {
	probes := noopProbes.Load()
	err := patch(context.Background(), b.client, benchNode, labelPatch(map[string]*string{deployPrefix + "container-toolkit": str("false")}), true)
	switch {
	case err == nil && noopProbes.Load() > probes:
		// A no-op webhook allows everything; that it saw the probe says it is active.
		return noopMechanism, nil
	case err == nil:
		return noMechanism, nil
	case apierrors.IsForbidden(err) && webhookDeniedRE.MatchString(err.Error()):
		return webhookMechanism, nil
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), celDenied):
		return celMechanism, nil
	}
	return noMechanism, fmt.Errorf("probe: %w", err)
}

func (m mechanism) String() string {
	return [...]string{"no admission", "a webhook", "the CEL policy", "a no-op webhook"}[m]
}

func (b *bench) waitActive(want mechanism) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := b.probe()
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after 30s the probe is still answered by: %v, want: %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// use makes m the only mechanism the API server consults.
func (b *bench) use(m mode) error {
	ctx := context.Background()
	ar := b.client.AdmissionregistrationV1()
	ignore := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if err := ignore(ar.ValidatingWebhookConfigurations().Delete(ctx, b.vwc.Name, metav1.DeleteOptions{})); err != nil {
		return err
	}
	if err := ignore(ar.ValidatingAdmissionPolicyBindings().Delete(ctx, b.binding.Name, metav1.DeleteOptions{})); err != nil {
		return err
	}
	if err := ignore(ar.ValidatingAdmissionPolicies().Delete(ctx, b.policy.Name, metav1.DeleteOptions{})); err != nil {
		return err
	}
	if err := b.waitActive(noMechanism); err != nil {
		return fmt.Errorf("unregistering everything: %w", err)
	}
	var err error
	switch m.mech() {
	case webhookMechanism, noopMechanism:
		_, err = ar.ValidatingWebhookConfigurations().Create(ctx, variants[m].vwc.DeepCopy(), metav1.CreateOptions{})
	case celMechanism:
		if _, err = ar.ValidatingAdmissionPolicies().Create(ctx, b.policy.DeepCopy(), metav1.CreateOptions{}); err == nil {
			_, err = ar.ValidatingAdmissionPolicyBindings().Create(ctx, b.binding.DeepCopy(), metav1.CreateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("registering %v: %w", m, err)
	}
	if err := b.waitActive(m.mech()); err != nil {
		return fmt.Errorf("registering %v: %w", m, err)
	}
	return nil
}

// decisionCase is one of the lab's label changes, by a person (the admin).
type decisionCase struct {
	node    string
	labels  map[string]*string
	allowed bool
}

func (c decisionCase) String() string {
	var parts []string
	for k, v := range c.labels {
		if v == nil {
			parts = append(parts, strings.TrimPrefix(k, deployPrefix)+"-")
		} else {
			parts = append(parts, strings.TrimPrefix(k, deployPrefix)+"="+*v)
		}
	}
	slices.Sort(parts)
	return c.node + " " + strings.Join(parts, " ")
}

var decisionCases = []decisionCase{
	{"lab-node-2", map[string]*string{deployPrefix + "device-plugin": str("true")}, false},
	{"lab-node-2", map[string]*string{deployPrefix + "device-plugin": str("true"), deployPrefix + "container-toolkit": str("true")}, true},
	{"lab-node-2", map[string]*string{deployPrefix + "container-toolkit": str("true")}, true},
	{"lab-node-2", map[string]*string{deployPrefix + "device-plugin": str("True")}, true},
	{"lab-node-0", map[string]*string{deployPrefix + "container-toolkit": nil}, false},
	{"lab-node-0", map[string]*string{deployPrefix + "container-toolkit": str("paused-for-driver-upgrade")}, false},
	{"lab-node-0", map[string]*string{deployPrefix + "device-plugin": str("false"), deployPrefix + "container-toolkit": str("false")}, true},
	{"lab-node-0", map[string]*string{deployPrefix + "device-plugin": nil, deployPrefix + "container-toolkit": nil}, true},
	{"lab-node-1", map[string]*string{deployPrefix + "container-toolkit": str("false")}, false},
	{"lab-node-1", map[string]*string{deployPrefix + "dcgm-exporter": str("false")}, true},
	{"lab-node-1", map[string]*string{deployPrefix + "driver": str("true")}, true},
	// Registered broken: edits that leave it broken are not refused, the repair neither.
	{"lab-node-3", map[string]*string{deployPrefix + "gpu-feature-discovery": str("true")}, true},
	{"lab-node-3", map[string]*string{deployPrefix + "container-toolkit": str("false")}, true},
	{"lab-node-3", map[string]*string{deployPrefix + "device-plugin": nil}, true},
}

// decide runs the case as a dry run and returns "allowed" or the refusal's
// own sentence (after the mechanism's opening).
func (b *bench) decide(c decisionCase, m mode) (string, error) {
	err := patch(context.Background(), b.client, c.node, labelPatch(c.labels), true)
	if err == nil {
		return "allowed", nil
	}
	opening := map[mechanism]string{webhookMechanism: webhookDenied, celMechanism: celDenied}[m.mech()]
	msg := err.Error()
	if i := strings.Index(msg, opening); apierrors.IsForbidden(err) && i >= 0 {
		return "refused: " + msg[i+len(opening):], nil
	}
	// Variants without matchConditions also send people's changes to the
	// observe webhook, and its refusal may come first.
	if loc := webhookDeniedRE.FindStringIndex(msg); m != webhook && m.mech() == webhookMechanism && apierrors.IsForbidden(err) && loc != nil {
		return "refused: " + msg[loc[1]:], nil
	}
	return "", fmt.Errorf("%s under %v: %w", c, m, err)
}

// checkDecisions: every case, as a dry run, under the webhook alone and the
// CEL policy alone. Both must give the case's expected outcome, and refuse
// with the same sentence.
func (b *bench) checkDecisions() error {
	got := map[mode][]string{}
	for _, m := range []mode{webhook, cel} {
		if err := b.use(m); err != nil {
			return err
		}
		for _, c := range decisionCases {
			d, err := b.decide(c, m)
			if err != nil {
				return err
			}
			got[m] = append(got[m], d)
		}
	}
	var problems []string
	for i, c := range decisionCases {
		w, l := got[webhook][i], got[cel][i]
		if (w == "allowed") != c.allowed {
			problems = append(problems, fmt.Sprintf("%s: webhook %s, want allowed=%v", c, w, c.allowed))
		}
		if w != l {
			problems = append(problems, fmt.Sprintf("%s: webhook and CEL policy disagree:\n  webhook: %s\n  CEL:     %s", c, w, l))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the CEL policy does not decide the lab like the webhook:\n%s", strings.Join(problems, "\n"))
	}
	logf("decisions: the webhook and the CEL policy agree on all %d lab changes (%d refused with the same sentence)",
		len(decisionCases), countRefused())
	// Every extra webhook mode must decide the lab like the shipped one; a
	// no-op webhook allows everything by design.
	for _, m := range modes[len(orders[0]):] {
		if m.mech() == noopMechanism {
			continue
		}
		if err := b.use(m); err != nil {
			return err
		}
		for i, c := range decisionCases {
			d, err := b.decide(c, m)
			if err != nil {
				return err
			}
			if d != got[webhook][i] {
				problems = append(problems, fmt.Sprintf("%s: %v %s, the shipped webhook %s", c, m, d, got[webhook][i]))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("a variant does not decide the lab like the shipped webhook:\n%s", strings.Join(problems, "\n"))
	}
	if len(modes) > len(orders[0]) {
		logf("decisions: the %d variants (no-op webhooks aside) decide all lab changes like the shipped webhook", len(modes)-len(orders[0]))
	}
	return nil
}

func countRefused() int {
	n := 0
	for _, c := range decisionCases {
		if !c.allowed {
			n++
		}
	}
	return n
}

// results are the measured latencies, per mode, in order, and per round.
type results struct {
	all      map[mode][]time.Duration
	perRound map[mode][][]time.Duration
	// costs: what the API server and serve say the measured requests spent
	// where (summed over each mode's measured blocks).
	costs    map[mode]costs
	warnings int64
	loadAvg  [2]string
	// Per measured block: TCP connections accepted on this machine
	// (PassiveOpens: the API server opening one to serve, as nothing else
	// connects during a block) and those established to the mode's serve
	// port at the end of the block.
	blocks              map[mode]int
	newConns, openConns map[mode]float64
	// cpu is the CPU time the processes of cpuOf spent during the measured
	// blocks, in ns, by process.
	cpu map[mode]map[string]float64
}

// cpuProcesses are the processes whose CPU time is shown, in table order.
var cpuProcesses = []string{"kube-apiserver", "etcd", "serve", "this program"}

// cpuOf reads the CPU time so far of each of cpuProcesses (serve: m's).
func (b *bench) cpuOf(m mode) (map[string]float64, error) {
	pids := b.cp.Pids()
	pids["serve"] = b.guardOf(m).Pid() // idle for a no-op mode: the no-op runs in this program
	pids["this program"] = os.Getpid()
	out := map[string]float64{}
	for _, name := range cpuProcesses {
		ns, err := cpuNanos(pids[name])
		if err != nil {
			return nil, fmt.Errorf("CPU time of %s: %w", name, err)
		}
		out[name] = ns
	}
	return out, nil
}

// cpuNanos is the CPU time of all threads of pid so far (the first field of
// each thread's schedstat, in ns).
func cpuNanos(pid int) (float64, error) {
	if pid == 0 {
		return 0, errors.New("not running")
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread has exited
		}
		if f := strings.Fields(string(data)); len(f) > 0 {
			v, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, err
			}
			total += v
		}
	}
	return total, nil
}

// A step of a request, as a histogram's sum and count.
type cost struct{ sum, n float64 }

type costs map[string]cost

// step is a histogram (or a counter) read from /metrics.
type step struct {
	key, metric      string
	labels           map[string]string
	fromGuard        bool
	extra, isCounter bool
}

// The steps read from /metrics, in table order. extra ones are shown only
// with -variants, in a table of their own; a counter's sum is its increase.
var steps = []step{
	{"PATCH in the API server", "apiserver_request_duration_seconds",
		map[string]string{"verb": "PATCH", "resource": "nodes", "dry_run": ""}, false, false, false},
	{"ValidatingAdmissionPolicy step", "apiserver_admission_controller_admission_duration_seconds",
		map[string]string{"name": "ValidatingAdmissionPolicy", "operation": "UPDATE"}, false, false, false},
	{"ValidatingAdmissionWebhook step", "apiserver_admission_controller_admission_duration_seconds",
		map[string]string{"name": "ValidatingAdmissionWebhook", "operation": "UPDATE"}, false, false, false},
	{"enforce webhook call", "apiserver_admission_webhook_admission_duration_seconds",
		map[string]string{"name": "enforce.gpu-deploy-guard.io", "operation": "UPDATE"}, false, false, false},
	{"review inside serve", "gpu_deploy_guard_admission_review_duration_seconds", nil, true, false, false},
	{"validating admission (all plugins)", "apiserver_admission_step_admission_duration_seconds",
		map[string]string{"type": "validate", "operation": "UPDATE"}, false, true, false},
	{"observe webhook call", "apiserver_admission_webhook_admission_duration_seconds",
		map[string]string{"name": "observe.gpu-deploy-guard.io", "operation": "UPDATE"}, false, true, false},
	// Observed only when a condition is false or fails: a webhook that
	// matches (all true) adds nothing here.
	{"matchConditions evaluation (when excluded)", "apiserver_admission_match_condition_evaluation_seconds",
		map[string]string{"kind": "webhook", "operation": "UPDATE"}, false, true, false},
	{"matchConditions exclusions", "apiserver_admission_match_condition_exclusions_total",
		map[string]string{"kind": "webhook", "operation": "UPDATE"}, false, true, true},
	{"webhook requests", "apiserver_admission_webhook_request_total",
		map[string]string{"type": "validating", "operation": "UPDATE"}, false, true, true},
}

// webhookDeniedRE is a refusal by either of the configuration's webhooks.
var webhookDeniedRE = regexp.MustCompile(`admission webhook "[a-z]+\.gpu-deploy-guard\.io" denied the request: `)

var labelRE = regexp.MustCompile(`([a-zA-Z_]+)="([^"]*)"`)

// addHistograms adds the _sum and _count samples of each step found in a
// Prometheus text exposition to c.
func addHistograms(c costs, text string, fromGuard bool, sign float64) {
	for _, line := range strings.Split(text, "\n") {
		for _, st := range steps {
			if st.fromGuard != fromGuard || !strings.HasPrefix(line, st.metric) {
				continue
			}
			rest := strings.TrimPrefix(line, st.metric)
			var field string
			switch {
			// Exactly the metric: apiserver_admission_step_admission_duration_seconds
			// has a sibling ..._summary, whose samples start with "_sum" too.
			case st.isCounter && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")):
				field = "sum"
			case st.isCounter:
				continue
			case strings.HasPrefix(rest, "_sum{") || strings.HasPrefix(rest, "_sum "):
				field = "sum"
			case strings.HasPrefix(rest, "_count{") || strings.HasPrefix(rest, "_count "):
				field = "count"
			default:
				continue
			}
			labels := map[string]string{}
			if i, j := strings.IndexByte(line, '{'), strings.LastIndexByte(line, '}'); i >= 0 && j > i {
				for _, m := range labelRE.FindAllStringSubmatch(line[i+1:j], -1) {
					labels[m[1]] = m[2]
				}
			}
			match := true
			for k, v := range st.labels {
				match = match && labels[k] == v
			}
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if !match || err != nil {
				continue
			}
			cur := c[st.key]
			if field == "sum" {
				cur.sum += sign * v
			} else {
				cur.n += sign * v
			}
			c[st.key] = cur
		}
	}
}

// snapshot reads the API server's and serve's metrics into c, added with
// sign (+1 after a block, -1 before it).
func (b *bench) snapshot(c costs, sign float64, guard *framework.Guard) error {
	raw, err := b.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		return fmt.Errorf("API server /metrics: %w", err)
	}
	addHistograms(c, string(raw), false, sign)
	guardText, err := guard.MetricsText()
	if err != nil {
		return fmt.Errorf("gpu-deploy-guard /metrics: %w", err)
	}
	addHistograms(c, guardText, true, sign)
	return nil
}

// orders are the six orders of the three modes; round r uses orders[r%6].
var orders = [][]mode{
	{none, webhook, cel}, {webhook, cel, none}, {cel, none, webhook},
	{none, cel, webhook}, {cel, webhook, none}, {webhook, none, cel},
}

// order is round r's order. With -variants (k modes): the k rotations of
// the modes, then the k rotations of the reversed list, so each mode is as
// often at each position and before and after each neighbour.
func order(r int) []mode {
	k := len(modes)
	if k == len(orders[0]) {
		return orders[r%len(orders)]
	}
	base := slices.Clone(modes)
	if (r/k)%2 == 1 {
		slices.Reverse(base)
	}
	i := r % k
	return append(base[i:], base[:i]...)
}

// guardOf is the serve process whose metrics count for m.
func (b *bench) guardOf(m mode) *framework.Guard {
	if g := variants[m].guard; g != nil {
		return g
	}
	return b.guard
}

// portOf is the port the API server calls for m.
func (b *bench) portOf(m mode) int {
	if n := variants[m].noop; n != nil {
		return n.port
	}
	return b.guardOf(m).Port
}

// passiveOpens is the kernel's count of TCP connections accepted so far.
func passiveOpens() (float64, error) {
	data, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0, err
	}
	var header []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if header == nil {
			header = f
			continue
		}
		for i, h := range header {
			if h == "PassiveOpens" && i < len(f) {
				return strconv.ParseFloat(f[i], 64)
			}
		}
	}
	return 0, errors.New("/proc/net/snmp has no Tcp PassiveOpens")
}

// established counts the TCP connections in state ESTABLISHED whose local
// port is port.
func established(port int) (float64, error) {
	n := 0.0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != "01" {
				continue
			}
			if i := strings.LastIndexByte(f[1], ':'); i >= 0 {
				if p, err := strconv.ParseInt(f[1][i+1:], 16, 32); err == nil && int(p) == port {
					n++
				}
			}
		}
	}
	return n, nil
}

func (b *bench) measure(o options) (*results, error) {
	res := &results{all: map[mode][]time.Duration{}, perRound: map[mode][][]time.Duration{}, costs: map[mode]costs{},
		blocks: map[mode]int{}, newConns: map[mode]float64{}, openConns: map[mode]float64{}, cpu: map[mode]map[string]float64{}}
	for _, m := range modes {
		res.costs[m] = costs{}
	}
	res.loadAvg[0] = loadAvg()
	ctx := context.Background()
	value := false
	flip := func() error { // dcgm-exporter true <-> false: a real change every time
		value = !value
		return patch(ctx, b.measured, benchNode, labelPatch(map[string]*string{deployPrefix + "dcgm-exporter": str(fmt.Sprint(value))}), false)
	}
	if o.warmup > 0 {
		for _, m := range modes {
			if err := b.use(m); err != nil {
				return nil, err
			}
			for i := 0; i < o.warmup; i++ {
				if err := flip(); err != nil {
					return nil, fmt.Errorf("warm-up under %v: %w", m, err)
				}
			}
		}
	}
	b.warnings.Store(0)
	for r := 0; r < o.rounds; r++ {
		for _, m := range order(r) {
			if err := b.use(m); err != nil {
				return nil, err
			}
			// A few unmeasured requests after each switch: the API server's
			// first call to a newly registered webhook opens a connection.
			for i := 0; i < 5; i++ {
				if err := flip(); err != nil {
					return nil, fmt.Errorf("round %d, %v: %w", r+1, m, err)
				}
			}
			if err := b.snapshot(res.costs[m], -1, b.guardOf(m)); err != nil {
				return nil, err
			}
			opens0, err := passiveOpens()
			if err != nil {
				return nil, err
			}
			cpu0, err := b.cpuOf(m)
			if err != nil {
				return nil, err
			}
			round := make([]time.Duration, 0, o.perRound)
			for i := 0; i < o.perRound; i++ {
				time.Sleep(o.gap)
				t0 := time.Now()
				err := flip()
				d := time.Since(t0)
				if err != nil {
					return nil, fmt.Errorf("round %d, %v: PATCH %s: %w", r+1, m, benchNode, err)
				}
				round = append(round, d)
			}
			cpu1, err := b.cpuOf(m)
			if err != nil {
				return nil, err
			}
			opens1, err := passiveOpens()
			if err != nil {
				return nil, err
			}
			if res.cpu[m] == nil {
				res.cpu[m] = map[string]float64{}
			}
			for name, v := range cpu1 {
				res.cpu[m][name] += v - cpu0[name]
			}
			open, err := established(b.portOf(m))
			if err != nil {
				return nil, err
			}
			res.blocks[m]++
			res.newConns[m] += opens1 - opens0
			res.openConns[m] += open
			if err := b.snapshot(res.costs[m], +1, b.guardOf(m)); err != nil {
				return nil, err
			}
			res.all[m] = append(res.all[m], round...)
			res.perRound[m] = append(res.perRound[m], round)
		}
		logf("round %d/%d done (order %v)", r+1, o.rounds, order(r))
	}
	res.warnings = b.warnings.Load()
	b.warningTexts.mu.Lock()
	for text, n := range b.warningTexts.texts {
		logf("Warning header on a flip of the DCGM exporter (%d×, warm-up included): %s", n, text)
	}
	b.warningTexts.mu.Unlock()
	res.loadAvg[1] = loadAvg()
	return res, b.use(none)
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// quantile is the nearest-rank quantile of sorted samples.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

type stats struct {
	n                   int
	p50, p90, p99, mean time.Duration
}

func summarize(samples []time.Duration) stats {
	s := slices.Clone(samples)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	st := stats{n: len(s), p50: quantile(s, 0.5), p90: quantile(s, 0.9), p99: quantile(s, 0.99)}
	if len(s) > 0 {
		st.mean = sum / time.Duration(len(s))
	}
	return st
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", float64(a)/float64(b))
}

func report(o options, res *results, started time.Time) string {
	st := map[mode]stats{}
	for _, m := range modes {
		st[m] = summarize(res.all[m])
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Node label PATCH latency through kube-apiserver (%d rounds × %d PATCHes per mode, interleaved)\n\n",
		o.rounds, o.perRound)
	fmt.Fprintf(&b, "| mode | n | p50 ms | p90 ms | p99 ms | mean ms | p50 / none | mean / none | p50 webhook / CEL |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range modes {
		s := st[m]
		vsCEL := "—"
		if m.mech() == webhookMechanism || m.mech() == noopMechanism {
			vsCEL = ratio(s.p50, st[cel].p50)
		}
		fmt.Fprintf(&b, "| %v | %d | %s | %s | %s | %s | %s | %s | %s |\n",
			m, s.n, ms(s.p50), ms(s.p90), ms(s.p99), ms(s.mean), ratio(s.p50, st[none].p50), ratio(s.mean, st[none].mean), vsCEL)
	}

	// Paired by round: the modes of one round ran within seconds of each
	// other, so these differences are the least disturbed by drift.
	var diffs, ratios []float64
	for r := range res.perRound[none] {
		p := func(m mode) time.Duration { return summarize(res.perRound[m][r]).p50 }
		diffs = append(diffs, float64(p(webhook)-p(none))/float64(time.Millisecond))
		ratios = append(ratios, float64(p(webhook))/float64(p(cel)))
	}
	slices.Sort(diffs)
	slices.Sort(ratios)
	med := func(v []float64) float64 {
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	fmt.Fprintf(&b, "\nPer round (each round's medians, then the median over rounds): webhook − none %+.3f ms (range %+.3f … %+.3f); webhook / CEL %.2f (range %.2f … %.2f)\n",
		med(diffs), diffs[0], diffs[len(diffs)-1], med(ratios), ratios[0], ratios[len(ratios)-1])

	fmt.Fprintf(&b, "\nWhere the time goes: the API server's and serve's own histograms over the measured blocks, mean ms per call "+
		"(in brackets, calls per measured PATCH when not 1: the admission plugins also count other objects' updates, such as the API server's lease)\n\n")
	basic := slices.DeleteFunc(slices.Clone(steps), func(s step) bool { return s.extra })
	fmt.Fprintf(&b, "| mode | client-side mean |")
	for _, step := range basic {
		fmt.Fprintf(&b, " %s |", step.key)
	}
	fmt.Fprintf(&b, "\n|---|---:|%s\n", strings.Repeat("---:|", len(basic)))
	for _, m := range modes {
		fmt.Fprintf(&b, "| %v | %s |", m, ms(st[m].mean))
		for _, step := range basic {
			c := res.costs[m][step.key]
			switch {
			case c.n < 0.5:
				fmt.Fprintf(&b, " — |")
			case math.Abs(c.n-float64(st[m].n)) < 0.5:
				fmt.Fprintf(&b, " %.3f |", 1000*c.sum/c.n)
			default:
				fmt.Fprintf(&b, " %.3f (%.2f) |", 1000*c.sum/c.n, c.n/float64(st[m].n))
			}
		}
		fmt.Fprintf(&b, "\n")
	}

	if len(modes) > len(orders[0]) {
		b.WriteString(variantsReport(res, st, med))
	}

	b.WriteString(ourCost(res, med))
	fmt.Fprintf(&b, "\nSetup: one kube-apiserver (etcd --unsafe-no-fsync), client-go JSON merge patch of nvidia.com/gpu.deploy.dcgm-exporter "+
		"(true ↔ false, allowed) on %s by a system:masters user, sequential; only one mechanism registered per mode "+
		"(deploy/base webhook on https://127.0.0.1, serve --no-cluster-watch; or deploy/cel); 5 unmeasured PATCHes after each switch, "+
		"%d per mode before the first round. Warning headers on measured requests: %d. %d CPUs (GOMAXPROCS %d), load average %s at the start, %s at the end; "+
		"%s in all.\n", benchNode, o.warmup, res.warnings, runtime.NumCPU(), runtime.GOMAXPROCS(0), res.loadAvg[0], res.loadAvg[1],
		time.Since(started).Round(time.Second))
	if o.nodeLabels > 0 || o.nodeImages > 0 {
		fmt.Fprintf(&b, "The bench node carries %d extra labels and %d images in its status.\n", o.nodeLabels, o.nodeImages)
	}
	if o.gap > 0 {
		fmt.Fprintf(&b, "Pause before each measured PATCH: %v (the CPU times above include what the processes did meanwhile).\n", o.gap)
	}
	return b.String()
}

// ourCost pairs each no-op mode with the webhook mode of the same changes
// (the shipped one for plain "noop"), round by round: ours − no-op is what
// serve adds to a PATCH, ours / CEL what the webhook costs against the
// policy that runs inside the API server. The targets are judged on the
// HTTP/1.1 pair (what the API server speaks to a Service), else the first.
func ourCost(res *results, med func([]float64) float64) string {
	var b strings.Builder
	type pair struct{ ours, noop mode }
	var pairs []pair
	for _, n := range modes {
		if n.mech() != noopMechanism {
			continue
		}
		want := strings.Join(slices.DeleteFunc(strings.Split(variants[n].spec, "+"), func(c string) bool { return c == "noop" }), "+")
		for _, m := range modes {
			if m.mech() == webhookMechanism && (variants[m].spec == want || (want == "" && m == webhook)) {
				pairs = append(pairs, pair{m, n})
				break
			}
		}
	}
	if len(pairs) == 0 {
		return "\nNo no-op webhook mode (-variants noop or noop+http1): serve's own cost is not separated from the API server's.\n"
	}
	fmt.Fprintf(&b, "\n### Our cost: ours − a no-op webhook with the same configuration, paired by round (median over rounds, range in brackets)\n\n")
	fmt.Fprintf(&b, "| webhook | no-op | ours − no-op ms | ours / CEL | no-op / CEL | targets (≤ 0.1 ms, ≤ 1.15) |\n|---|---|---:|---:|---:|---|\n")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	judged := pairs[0]
	for _, p := range pairs {
		if strings.Contains(variants[p.noop].spec, "http1") {
			judged = p
			break
		}
	}
	var judgedLine string
	for _, p := range pairs {
		var diff, vsCEL, noopCEL []float64
		for r := range res.perRound[p.ours] {
			p50 := func(m mode) time.Duration { return summarize(res.perRound[m][r]).p50 }
			diff = append(diff, float64(p50(p.ours)-p50(p.noop))/float64(time.Millisecond))
			vsCEL = append(vsCEL, float64(p50(p.ours))/float64(p50(cel)))
			noopCEL = append(noopCEL, float64(p50(p.noop))/float64(p50(cel)))
		}
		slices.Sort(diff)
		slices.Sort(vsCEL)
		slices.Sort(noopCEL)
		d, c := med(diff), med(vsCEL)
		fmt.Fprintf(&b, "| %v | %v | %+.3f (%+.2f … %+.2f) | %.2f (%.2f … %.2f) | %.2f | %s, %s |\n", p.ours, p.noop,
			d, diff[0], diff[len(diff)-1], c, vsCEL[0], vsCEL[len(vsCEL)-1], med(noopCEL), verdict(d <= 0.1), verdict(c <= 1.15))
		if p == judged {
			judgedLine = fmt.Sprintf("\nTargets (%v): ours − no-op %+.3f ms at the median, %s (≤ 0.1 ms); ours / CEL %.2f, %s (≤ 1.15).\n",
				p.ours, d, verdict(d <= 0.1), c, verdict(c <= 1.15))
		}
	}
	b.WriteString(judgedLine)
	return b.String()
}

// noopProbes counts the probes (dry runs) any no-op webhook has answered.
var noopProbes atomic.Int64

// noopWebhook answers every review allowed, after reading it for its uid.
type noopWebhook struct {
	ip   string
	port int
	srv  *http.Server
}

func startNoop(ip, certDir string) (*noopWebhook, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("no-op webhook: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("no-op webhook: %w", err)
	}
	n := &noopWebhook{ip: ip, port: ln.Addr().(*net.TCPAddr).Port}
	n.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var review struct {
				Request struct {
					UID    string `json:"uid"`
					DryRun bool   `json:"dryRun"`
				} `json:"request"`
			}
			if err := json.NewDecoder(r.Body).Decode(&review); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if review.Request.DryRun {
				noopProbes.Add(1)
			}
			answer, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
				"response": map[string]any{"uid": review.Request.UID, "allowed": true}})
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(answer)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		// Longer than the API server keeps an idle connection (90 s), as serve's.
		IdleTimeout: 120 * time.Second,
		ErrorLog:    log.New(io.Discard, "", 0),
	}
	go func() { _ = n.srv.ServeTLS(ln, "", "") }()
	return n, nil
}

func (n *noopWebhook) url() string {
	return "https://" + net.JoinHostPort(n.ip, strconv.Itoa(n.port)) + "/validate"
}

func (n *noopWebhook) stop() { _ = n.srv.Close() }

// variantsReport compares every webhook mode with the shipped one, paired by
// round, and shows the extra metrics and the connections of every mode.
func variantsReport(res *results, st map[mode]stats, med func([]float64) float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Variants, paired by round (median over rounds of each round's p50 difference, range in brackets)\n\n")
	fmt.Fprintf(&b, "| mode | p50 ms | p99 ms | − none ms | − shipped webhook ms | / CEL | changes |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, m := range modes {
		if m.mech() != webhookMechanism && m.mech() != noopMechanism {
			continue
		}
		var vsNone, vsShipped, vsCEL []float64
		for r := range res.perRound[m] {
			p := func(m mode) time.Duration { return summarize(res.perRound[m][r]).p50 }
			vsNone = append(vsNone, float64(p(m)-p(none))/float64(time.Millisecond))
			vsShipped = append(vsShipped, float64(p(m)-p(webhook))/float64(time.Millisecond))
			vsCEL = append(vsCEL, float64(p(m))/float64(p(cel)))
		}
		slices.Sort(vsNone)
		slices.Sort(vsShipped)
		slices.Sort(vsCEL)
		about := variants[m].about
		if about == "" {
			about = "deploy/base as shipped"
		}
		fmt.Fprintf(&b, "| %v | %s | %s | %+.3f (%+.2f … %+.2f) | %+.3f (%+.2f … %+.2f) | %.2f (%.2f … %.2f) | %s |\n",
			m, ms(st[m].p50), ms(st[m].p99),
			med(vsNone), vsNone[0], vsNone[len(vsNone)-1],
			med(vsShipped), vsShipped[0], vsShipped[len(vsShipped)-1],
			med(vsCEL), vsCEL[0], vsCEL[len(vsCEL)-1], about)
	}

	fmt.Fprintf(&b, "\nMore of the API server's metrics over the measured blocks: histograms as mean ms per observation "+
		"[observations per measured PATCH], counters as increase per measured PATCH; connections per measured block\n\n")
	fmt.Fprintf(&b, "| mode | PATCH in the API server | ValidatingAdmissionWebhook step |")
	var extra []step
	for _, s := range steps {
		if s.extra {
			extra = append(extra, s)
			fmt.Fprintf(&b, " %s |", s.key)
		}
	}
	fmt.Fprintf(&b, " enforce webhook call | review inside serve | TCP connections accepted | established to serve |\n|---|%s\n",
		strings.Repeat("---:|", len(extra)+6))
	cell := func(m mode, key string, counter bool) string {
		c := res.costs[m][key]
		n := float64(st[m].n)
		switch {
		case counter && c.sum == 0:
			return "0"
		case counter:
			return fmt.Sprintf("%.2f", c.sum/n)
		case c.n < 0.5:
			return "—"
		}
		return fmt.Sprintf("%.3f [%.2f]", 1000*c.sum/c.n, c.n/n)
	}
	for _, m := range modes {
		fmt.Fprintf(&b, "| %v | %s | %s |", m, cell(m, "PATCH in the API server", false), cell(m, "ValidatingAdmissionWebhook step", false))
		for _, s := range extra {
			fmt.Fprintf(&b, " %s |", cell(m, s.key, s.isCounter))
		}
		blocks := float64(max(1, res.blocks[m]))
		fmt.Fprintf(&b, " %s | %s | %.2f | %.2f |\n", cell(m, "enforce webhook call", false), cell(m, "review inside serve", false),
			res.newConns[m]/blocks, res.openConns[m]/blocks)
	}
	fmt.Fprintf(&b, "\nCPU time during the measured blocks, ms per measured PATCH (2 CPUs: what one process burns, the others wait for)\n\n| mode |")
	for _, name := range cpuProcesses {
		fmt.Fprintf(&b, " %s |", name)
	}
	fmt.Fprintf(&b, " sum |\n|---|%s\n", strings.Repeat("---:|", len(cpuProcesses)+1))
	for _, m := range modes {
		n := float64(max(1, st[m].n))
		fmt.Fprintf(&b, "| %v |", m)
		sum := 0.0
		for _, name := range cpuProcesses {
			v := res.cpu[m][name] / n / 1e6
			sum += v
			fmt.Fprintf(&b, " %.3f |", v)
		}
		fmt.Fprintf(&b, " %.3f |\n", sum)
	}
	fmt.Fprintf(&b, "\nServe processes: ")
	seen := map[*framework.Guard]bool{}
	var gs []string
	for _, m := range modes {
		if g := variants[m].guard; g != nil && !seen[g] {
			seen[g] = true
			gs = append(gs, fmt.Sprintf("%s (%v)", g.URL(), m))
		}
	}
	fmt.Fprintf(&b, "%s. The API server speaks HTTP/2 to a loopback URL when serve offers it, HTTP/1.1 to any other address and to a Service.\n",
		strings.Join(gs, "; "))
	return b.String()
}
