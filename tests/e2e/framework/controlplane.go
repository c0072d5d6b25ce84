// Package framework runs a real, local Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler; no kubelet) for
// the gpu-deploy-guard end-to-end tests, and drives it with the real kubectl.
//
// Nodes in these tests are API objects created with kubectl. kwok plays
// their kubelets (see scheduling.go): it keeps every node Ready with a
// Lease, runs the DaemonSet pods the scheduler binds to it, and finishes pod
// deletions. That is enough for what the product cares about: admission of
// Node label and taint changes, the DaemonSet controller's placement of the
// operands (status.desiredNumberScheduled, taints included) and the pods
// that run where.
package framework

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultControllers is the kube-controller-manager controller set.
//
// node-lifecycle-controller is deliberately absent. kwok keeps the nodes
// Ready and their Leases fresh, but a node created by a test is not Ready
// until kwok has seen it, and kwok cannot renew Leases while a test holds
// kube-apiserver down (RestartAPIServer): the controller would then taint
// the node node.kubernetes.io/not-ready or unreachable:NoSchedule, which
// DaemonSet pods do not tolerate, and desiredNumberScheduled would follow
// the timing of kwok and not the nodes' labels and the tests' taints alone.
// Controllers that need kubelets, a cloud, or node CIDRs are left out too;
// what remains is what DaemonSets and namespaced test objects need.
var DefaultControllers = []string{
	"daemonset-controller",
	"serviceaccount-controller",       // "default" SA, without which DaemonSet pods are rejected
	"serviceaccount-token-controller", // legacy token secrets (uses --service-account-private-key-file)
	"root-ca-certificate-publisher-controller",
	"namespace-controller",         // namespace deletion actually finishes
	"garbage-collector-controller", // deleting a DaemonSet removes its pods
	"clusterrole-aggregation-controller",
	"deployment-controller",
	"replicaset-controller",
	"validatingadmissionpolicy-status-controller",
}

// ServiceCIDR is the API server's --service-cluster-ip-range. Nothing routes
// to it (no kube-proxy); it only has to be a valid range.
const ServiceCIDR = "10.0.0.0/24"

// Config says where the binaries are and how to run them.
type Config struct {
	BinDir  string // holds kube-apiserver, kube-controller-manager, etcd
	Kubectl string // kubectl binary

	// WorkDir holds certificates, etcd data, kubeconfigs and logs. A fresh
	// temporary directory is created when empty.
	WorkDir string

	Controllers []string // default DefaultControllers
	// NoScheduling starts neither kube-scheduler nor kwok: pods are never
	// bound, run or finally deleted, nodes get no status and no Leases
	// (a benchmark that needs no pods and no background writes).
	NoScheduling bool
	// NoControllerManager starts etcd and kube-apiserver only: no
	// controllers create, bind or delete anything (a benchmark that
	// creates every object itself). The admin kubeconfig is still written.
	// Implies NoScheduling.
	NoControllerManager        bool
	ExtraEtcdArgs              []string
	ExtraAPIServerArgs         []string
	ExtraControllerManagerArgs []string
	ExtraSchedulerArgs         []string
	ExtraKwokArgs              []string

	Logf func(format string, args ...any) // progress; default: stderr
}

// Timings records how long each start-up phase took.
type Timings struct {
	Certs, Etcd, APIServer, ControllerManager time.Duration
	Scheduler, Kwok                           time.Duration
	APIServerReady                            time.Duration // from Start to /readyz OK
	Total                                     time.Duration // from Start to controllers working
}

// ControlPlane is a running etcd + kube-apiserver + kube-controller-manager
// + kube-scheduler, with kwok as the nodes' kubelets.
type ControlPlane struct {
	Dir            string // work dir (removed by Stop unless kept)
	LogDir         string // <component>.log files
	KubeconfigPath string // admin (system:masters) kubeconfig
	APIServerURL   string // https://127.0.0.1:<port>
	EtcdURL        string
	CA             *CA    // signs the API server and client certs; see CA.IssueServingCert
	CACertFile     string // PEM file of CA.CertPEM
	KubectlPath    string
	Timings        Timings

	cfg      Config
	ownDir   bool
	admin    *http.Client
	etcd     *process
	apiSrv   *process
	apiArgs  []string // the API server's flags, for RestartAPIServer
	kcm      *process
	sched    *process
	kwok     *process
	stopOnce sync.Once
	cleanups []func()
	kcmPort  int
	certsDir string
	// registered is RegisterGuard's last apply (see there).
	registered registration
}

// Pids are the process ids of the running components, by name (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kwok).
func (cp *ControlPlane) Pids() map[string]int {
	pids := map[string]int{}
	for name, p := range map[string]*process{"etcd": cp.etcd, "kube-apiserver": cp.apiSrv,
		"kube-controller-manager": cp.kcm, "kube-scheduler": cp.sched, "kwok": cp.kwok} {
		if p != nil && p.cmd != nil && p.cmd.Process != nil {
			if gone, _ := p.exited(); !gone {
				pids[name] = p.cmd.Process.Pid
			}
		}
	}
	return pids
}

// Start brings up etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and kwok, and returns once the API server is ready, the
// controller manager has done visible work and the scheduler and kwok
// serve their health checks. On error everything started so far is stopped
// again; the returned ControlPlane (if non-nil) still allows DumpLogs.
func Start(cfg Config) (cp *ControlPlane, err error) {
	t0 := time.Now()
	if cfg.Logf == nil {
		cfg.Logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "e2e: "+f+"\n", a...) }
	}
	if len(cfg.Controllers) == 0 {
		cfg.Controllers = DefaultControllers
	}
	bins := []string{"etcd", "kube-apiserver", "kube-controller-manager"}
	if !cfg.NoControllerManager && !cfg.NoScheduling {
		bins = append(bins, "kube-scheduler", "kwok")
	}
	for _, b := range bins {
		if st, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil || st.IsDir() {
			return nil, fmt.Errorf("control-plane binary %s not found in %q (run tests/e2e/build-control-plane.sh)", b, cfg.BinDir)
		}
	}
	if cfg.Kubectl == "" {
		return nil, errors.New("no kubectl configured")
	}

	cp = &ControlPlane{cfg: cfg, KubectlPath: cfg.Kubectl}
	if cfg.WorkDir == "" {
		if cp.Dir, err = os.MkdirTemp("", "gdg-e2e-"); err != nil {
			return nil, err
		}
		cp.ownDir = true
	} else {
		cp.Dir = cfg.WorkDir
		if err := os.MkdirAll(cp.Dir, 0o755); err != nil {
			return nil, err
		}
	}
	cp.LogDir = filepath.Join(cp.Dir, "logs")
	cp.certsDir = filepath.Join(cp.Dir, "pki")
	for _, d := range []string{cp.LogDir, cp.certsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return cp, err
		}
	}
	defer func() {
		if err != nil {
			cp.stopProcesses()
		}
	}()

	phase := time.Now()
	pki, err := cp.writePKI()
	if err != nil {
		return cp, fmt.Errorf("certificates: %w", err)
	}
	cp.Timings.Certs = time.Since(phase)

	phase = time.Now()
	if err := cp.startEtcd(); err != nil {
		return cp, fmt.Errorf("etcd: %w", err)
	}
	cp.Timings.Etcd = time.Since(phase)
	cfg.Logf("etcd ready at %s after %s", cp.EtcdURL, cp.Timings.Etcd.Round(time.Millisecond))

	phase = time.Now()
	if err := cp.startAPIServer(pki); err != nil {
		return cp, fmt.Errorf("kube-apiserver: %w", err)
	}
	cp.Timings.APIServer = time.Since(phase)
	cp.Timings.APIServerReady = time.Since(t0)
	cfg.Logf("kube-apiserver ready at %s after %s (%s since start)", cp.APIServerURL,
		cp.Timings.APIServer.Round(time.Millisecond), cp.Timings.APIServerReady.Round(time.Millisecond))
	if err := cp.checkAdmissionPlugins(); err != nil {
		return cp, err
	}

	if err := writeKubeconfig(cp.KubeconfigPathFor("admin"), cp.APIServerURL, "e2e-admin", cp.CA.CertPEM, pki.adminCertPEM, pki.adminKeyPEM); err != nil {
		return cp, err
	}
	cp.KubeconfigPath = cp.KubeconfigPathFor("admin")
	if cfg.NoControllerManager {
		cp.Timings.Total = time.Since(t0)
		cfg.Logf("no kube-controller-manager (NoControllerManager); control plane up in %s (certs %s)",
			cp.Timings.Total.Round(time.Millisecond), cp.Timings.Certs.Round(time.Millisecond))
		return cp, nil
	}

	phase = time.Now()
	if err := cp.startControllerManager(pki); err != nil {
		return cp, fmt.Errorf("kube-controller-manager: %w", err)
	}
	cp.Timings.ControllerManager = time.Since(phase)
	if !cfg.NoScheduling {
		phase = time.Now()
		if err := cp.startScheduler(); err != nil {
			return cp, fmt.Errorf("kube-scheduler: %w", err)
		}
		cp.Timings.Scheduler = time.Since(phase)
		phase = time.Now()
		if err := cp.startKwok(); err != nil {
			return cp, fmt.Errorf("kwok: %w", err)
		}
		cp.Timings.Kwok = time.Since(phase)
	}
	cp.Timings.Total = time.Since(t0)
	cfg.Logf("kube-controller-manager working after %s, kube-scheduler after %s, kwok after %s; control plane up in %s (certs %s)",
		cp.Timings.ControllerManager.Round(time.Millisecond), cp.Timings.Scheduler.Round(time.Millisecond),
		cp.Timings.Kwok.Round(time.Millisecond), cp.Timings.Total.Round(time.Millisecond),
		cp.Timings.Certs.Round(time.Millisecond))
	return cp, nil
}

type pkiFiles struct {
	apiCert, apiKey string
	saPriv, saPub   string
	adminCertPEM    []byte
	adminKeyPEM     []byte
	kcmCertPEM      []byte
	kcmKeyPEM       []byte
}

func (cp *ControlPlane) writePKI() (*pkiFiles, error) {
	ca, err := NewCA("gpu-deploy-guard-e2e-ca")
	if err != nil {
		return nil, err
	}
	cp.CA = ca
	cp.CACertFile = filepath.Join(cp.certsDir, "ca.crt")
	if err := os.WriteFile(cp.CACertFile, ca.CertPEM, 0o644); err != nil {
		return nil, err
	}
	var p pkiFiles
	apiCert, apiKey, err := ca.Issue(CertSpec{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)}, // 10.0.0.1: first IP of ServiceCIDR, the "kubernetes" Service
		Server:     true,
	})
	if err != nil {
		return nil, err
	}
	if p.apiCert, p.apiKey, err = writeKeyPair(cp.certsDir, "apiserver", apiCert, apiKey); err != nil {
		return nil, err
	}
	if p.adminCertPEM, p.adminKeyPEM, err = ca.Issue(CertSpec{CommonName: "e2e-admin", Organizations: []string{"system:masters"}, Client: true}); err != nil {
		return nil, err
	}
	if p.kcmCertPEM, p.kcmKeyPEM, err = ca.Issue(CertSpec{CommonName: "system:kube-controller-manager", Client: true}); err != nil {
		return nil, err
	}
	if p.saPriv, p.saPub, err = writeServiceAccountKeys(cp.certsDir); err != nil {
		return nil, err
	}

	adminPair, err := tls.X509KeyPair(p.adminCertPEM, p.adminKeyPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	cp.admin = &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{adminPair}}},
	}
	return &p, nil
}

func (cp *ControlPlane) startEtcd() error {
	dataDir := filepath.Join(cp.Dir, "etcd-data")
	return retryOnEarlyExit("etcd", func() (*process, error) {
		clientPort, err := freePort()
		if err != nil {
			return nil, err
		}
		peerPort, err := freePort()
		if err != nil {
			return nil, err
		}
		_ = os.RemoveAll(dataDir)
		clientURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
		peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
		args := []string{
			"--name=e2e",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=e2e=" + peerURL,
			"--initial-cluster-state=new",
			"--unsafe-no-fsync=true", // throwaway data; fsync only slows tests down
			"--log-outputs=stderr",
		}
		args = append(args, cp.cfg.ExtraEtcdArgs...)
		p, err := startProcess("etcd", filepath.Join(cp.cfg.BinDir, "etcd"), args, cp.LogDir)
		if err != nil {
			return nil, err
		}
		cp.etcd = p
		cp.EtcdURL = clientURL
		plain := &http.Client{Timeout: 2 * time.Second}
		return p, waitHealthy(p, 60*time.Second, func() (bool, string) {
			return httpOK(plain, clientURL+"/health", `"health":"true"`)
		})
	})
}

func (cp *ControlPlane) startAPIServer(pki *pkiFiles) error {
	return retryOnEarlyExit("kube-apiserver", func() (*process, error) {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		url := "https://127.0.0.1:" + strconv.Itoa(port)
		args := []string{
			"--etcd-servers=" + cp.EtcdURL,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			// Loopback advertise address: otherwise the API server picks the
			// host's interface address. It cannot be an Endpoints address,
			// hence no endpoint reconciler for the "kubernetes" Service.
			"--advertise-address=127.0.0.1",
			"--endpoint-reconciler-type=none",
			"--cert-dir=" + filepath.Join(cp.Dir, "apiserver-certs"),
			"--tls-cert-file=" + pki.apiCert,
			"--tls-private-key-file=" + pki.apiKey,
			"--client-ca-file=" + cp.CACertFile,
			"--authorization-mode=Node,RBAC",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + pki.saPub,
			"--service-account-signing-key-file=" + pki.saPriv,
			"--service-cluster-ip-range=" + ServiceCIDR,
			// Both are on by default; naming them makes that a requirement
			// (checked after start-up) rather than an assumption.
			"--enable-admission-plugins=ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
			// TaintNodesByCondition taints every new Node
			// node.kubernetes.io/not-ready:NoSchedule, which only the
			// node-lifecycle controller removes once the node reports
			// Ready. That controller is not run (see DefaultControllers),
			// so every lab node would stay tainted, although kwok reports
			// it Ready, and no DaemonSet pod tolerates that taint:
			// desiredNumberScheduled would be 0 everywhere. Without the
			// plugin, created Nodes look like Ready nodes of a running
			// cluster as far as DaemonSet placement goes; the only taints
			// are the ones tests set.
			"--disable-admission-plugins=TaintNodesByCondition",
			"--allow-privileged=true",
		}
		args = append(args, cp.cfg.ExtraAPIServerArgs...)
		p, err := startProcess("kube-apiserver", filepath.Join(cp.cfg.BinDir, "kube-apiserver"), args, cp.LogDir)
		if err != nil {
			return nil, err
		}
		cp.apiSrv = p
		cp.apiArgs = args
		cp.APIServerURL = url
		return p, waitHealthy(p, 120*time.Second, func() (bool, string) {
			return httpOK(cp.admin, url+"/readyz", "ok")
		})
	})
}

// RestartAPIServer kills kube-apiserver (SIGKILL: a crashed control-plane
// node, no graceful close of the watches), leaves it down for `down`, and
// starts it again with the same flags on the same port, so every client's
// kubeconfig still points at it. Returns once /readyz is ok.
func (cp *ControlPlane) RestartAPIServer(down time.Duration) error {
	cp.apiSrv.kill()
	time.Sleep(down)
	p, err := startProcess("kube-apiserver", filepath.Join(cp.cfg.BinDir, "kube-apiserver"), cp.apiArgs, cp.LogDir)
	if err != nil {
		return err
	}
	cp.apiSrv = p
	return waitHealthy(p, 120*time.Second, func() (bool, string) {
		return httpOK(cp.admin, cp.APIServerURL+"/readyz", "ok")
	})
}

// checkAdmissionPlugins fails start-up unless the API server reported
// loading both validating admission plugins the product depends on.
func (cp *ControlPlane) checkAdmissionPlugins() error {
	const marker = "validating admission controller(s) successfully in the following order:"
	f, err := os.Open(cp.apiSrv.logPath)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, marker); i >= 0 {
			plugins := strings.Split(strings.TrimSuffix(strings.TrimSpace(line[i+len(marker):]), "."), ",")
			var webhook, policy bool
			for _, pl := range plugins {
				webhook = webhook || pl == "ValidatingAdmissionWebhook"
				policy = policy || pl == "ValidatingAdmissionPolicy"
			}
			if !webhook || !policy {
				return fmt.Errorf("kube-apiserver validating admission plugins lack ValidatingAdmissionWebhook or ValidatingAdmissionPolicy: %v", plugins)
			}
			return nil
		}
	}
	return errors.New("kube-apiserver log does not list its validating admission plugins; cannot confirm ValidatingAdmissionWebhook/ValidatingAdmissionPolicy are on")
}

func (cp *ControlPlane) startControllerManager(pki *pkiFiles) error {
	kcmKubeconfig := cp.KubeconfigPathFor("kube-controller-manager")
	if err := writeKubeconfig(kcmKubeconfig, cp.APIServerURL, "system:kube-controller-manager", cp.CA.CertPEM, pki.kcmCertPEM, pki.kcmKeyPEM); err != nil {
		return err
	}
	err := retryOnEarlyExit("kube-controller-manager", func() (*process, error) {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args := []string{
			"--kubeconfig=" + kcmKubeconfig,
			"--authentication-kubeconfig=" + kcmKubeconfig,
			"--authorization-kubeconfig=" + kcmKubeconfig,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(cp.Dir, "kcm-certs"),
			"--leader-elect=false", // sole instance: start controllers at once
			"--use-service-account-credentials=true",
			"--root-ca-file=" + cp.CACertFile,
			"--service-account-private-key-file=" + pki.saPriv,
			"--controllers=" + strings.Join(cp.cfg.Controllers, ","),
		}
		args = append(args, cp.cfg.ExtraControllerManagerArgs...)
		p, err := startProcess("kube-controller-manager", filepath.Join(cp.cfg.BinDir, "kube-controller-manager"), args, cp.LogDir)
		if err != nil {
			return nil, err
		}
		cp.kcm = p
		cp.kcmPort = port
		// Its serving certificate is self-signed and generated at start.
		insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		return p, waitHealthy(p, 60*time.Second, func() (bool, string) {
			return httpOK(insecure, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz", "ok")
		})
	})
	if err != nil {
		return err
	}
	// /healthz only says the process is up. The "default" ServiceAccount
	// appearing proves controllers run and can write with their own
	// service-account credentials.
	return waitHealthy(cp.kcm, 60*time.Second, func() (bool, string) {
		return httpOK(cp.admin, cp.APIServerURL+"/api/v1/namespaces/default/serviceaccounts/default", `"name":"default"`)
	})
}

// WriteUserKubeconfig writes a kubeconfig that authenticates as user (with
// the given groups) through a client certificate from the control plane's
// CA, and returns its path. Use it with KubectlAs to act as someone other
// than the admin, e.g. to test RBAC or per-user admission decisions.
func (cp *ControlPlane) WriteUserKubeconfig(user string, groups ...string) (string, error) {
	certPEM, keyPEM, err := cp.CA.Issue(CertSpec{CommonName: user, Organizations: groups, Client: true})
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(cp.Dir, "user-*.kubeconfig")
	if err != nil {
		return "", err
	}
	f.Close()
	if err := writeKubeconfig(f.Name(), cp.APIServerURL, user, cp.CA.CertPEM, certPEM, keyPEM); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// WriteTokenKubeconfig writes a kubeconfig named name (in the work dir)
// that authenticates with a bearer token, e.g. a service account's from
// `kubectl create token`, and returns its path.
func (cp *ControlPlane) WriteTokenKubeconfig(name, token string) (string, error) {
	path := cp.KubeconfigPathFor(name)
	return path, writeKubeconfigAuth(path, cp.APIServerURL, name, cp.CA.CertPEM,
		"    token: "+strconv.Quote(token)+"\n")
}

// AddCleanup registers f to run when the control plane stops, before its
// components are stopped: for processes that share the control plane's
// lifetime but are started later, such as the webhook under test.
func (cp *ControlPlane) AddCleanup(f func()) { cp.cleanups = append(cp.cleanups, f) }

// KubeconfigPathFor returns the path of the kubeconfig file named name in
// the work dir ("admin" is the one KubeconfigPath points at).
func (cp *ControlPlane) KubeconfigPathFor(name string) string {
	return filepath.Join(cp.Dir, name+".kubeconfig")
}

// Stop ends all components (SIGTERM to each process group, SIGKILL after a
// grace period) and removes the work dir if Start created it, unless
// GDG_E2E_KEEP=1. Safe to call more than once.
func (cp *ControlPlane) Stop() {
	if cp == nil {
		return
	}
	cp.stopOnce.Do(func() {
		// Clients of the control plane (a webhook, say) go first, newest
		// first, while the API server is still up.
		for i := len(cp.cleanups) - 1; i >= 0; i-- {
			cp.cleanups[i]()
		}
		cp.stopProcesses()
		if os.Getenv("GDG_E2E_KEEP") == "1" {
			cp.cfg.Logf("kept work dir %s (GDG_E2E_KEEP=1)", cp.Dir)
		} else if cp.ownDir {
			_ = os.RemoveAll(cp.Dir)
		}
	})
}

func (cp *ControlPlane) stopProcesses() {
	// Reverse start order: clients before the servers they talk to.
	cp.kwok.stop(10 * time.Second)
	cp.sched.stop(10 * time.Second)
	cp.kcm.stop(10 * time.Second)
	cp.apiSrv.stop(15 * time.Second)
	cp.etcd.stop(10 * time.Second)
}

// DumpLogs writes the last tailLines lines of every component log to w
// (tailLines <= 0: everything).
func (cp *ControlPlane) DumpLogs(w io.Writer, tailLines int) {
	if cp == nil || cp.LogDir == "" {
		return
	}
	files, _ := filepath.Glob(filepath.Join(cp.LogDir, "*.log"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(w, "==> %s: %v\n", f, err)
			continue
		}
		lines := strings.SplitAfter(string(data), "\n")
		if tailLines > 0 && len(lines) > tailLines {
			fmt.Fprintf(w, "==> %s (last %d of %d lines) <==\n", f, tailLines, len(lines))
			lines = lines[len(lines)-tailLines:]
		} else {
			fmt.Fprintf(w, "==> %s <==\n", f)
		}
		fmt.Fprint(w, strings.Join(lines, ""))
		fmt.Fprintln(w)
	}
}

// retryOnEarlyExit runs start up to three times when the component exits
// before becoming ready (typically: a just-picked free port was taken).
// A component that stays up but never becomes ready is not retried.
func retryOnEarlyExit(name string, start func() (*process, error)) error {
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		p, err := start()
		if err == nil {
			return nil
		}
		lastErr = err
		if p == nil {
			return err
		}
		if gone, _ := p.exited(); !gone {
			p.stop(5 * time.Second)
			return err
		}
		p.stop(time.Second)
		if attempt < 3 {
			fmt.Fprintf(os.Stderr, "e2e: %s exited during start-up (attempt %d): %v; retrying\n", name, attempt, err)
		}
	}
	return lastErr
}

// waitHealthy polls check until it succeeds, the process exits, or timeout.
func waitHealthy(p *process, timeout time.Duration, check func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	last := "not checked yet"
	for {
		if gone, err := p.exited(); gone {
			return fmt.Errorf("%s exited before becoming ready (%v); see %s", p.name, err, p.logPath)
		}
		ok, status := check()
		if ok {
			return nil
		}
		last = status
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %s; see %s", p.name, timeout, last, p.logPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpOK GETs url and reports whether it answered 200 with want in the body.
func httpOK(c *http.Client, url, want string) (bool, string) {
	resp, err := c.Get(url)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
		return true, ""
	}
	return false, fmt.Sprintf("GET %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
}

func writeKubeconfig(path, server, user string, caPEM, certPEM, keyPEM []byte) error {
	b64 := base64.StdEncoding.EncodeToString
	return writeKubeconfigAuth(path, server, user, caPEM,
		"    client-certificate-data: "+b64(certPEM)+"\n    client-key-data: "+b64(keyPEM)+"\n")
}

// writeKubeconfigAuth writes a one-context kubeconfig for server, trusting
// caPEM; auth holds the user's credential lines (indented under `user:`).
func writeKubeconfigAuth(path, server, user string, caPEM []byte, auth string) error {
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
%scontexts:
- name: e2e
  context:
    cluster: e2e
    user: %s
current-context: e2e
`, server, base64.StdEncoding.EncodeToString(caPEM), strconv.Quote(user), auth, strconv.Quote(user))
	return os.WriteFile(path, []byte(content), 0o600)
}
