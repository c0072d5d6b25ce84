package framework

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Guard is a running `gpu-deploy-guard serve` (the product binary), with a
// serving certificate made by `gpu-deploy-guard certs` for its IP (127.0.0.1
// unless GuardConfig.IP says otherwise). The API server reaches it at URL();
// there is no Service in between.
type Guard struct {
	Bin        string
	Dir        string // certs/ (ca.crt, tls.crt, tls.key) and whatever the caller put there
	ConfigFile string // passed as --config; empty: the binary's defaults
	Port       int    // HTTPS, POST /validate
	AdminPort  int    // plain HTTP: /readyz, /metrics
	// IP is the address of the HTTPS listener and of URL(); the admin port
	// stays on 127.0.0.1.
	IP string
	// CABundle is the PEM CA the API server must trust: the base64 text
	// `certs` printed, decoded (and checked to equal the ca.crt it wrote).
	CABundle []byte
	// Name is the process name in logs (<LogDir>/<Name>.log); default
	// "gpu-deploy-guard".
	Name string
	// Env is added to the process's environment (e.g. KUBECONFIG=...), and
	// ExtraArgs to its `serve` arguments (e.g. --report).
	Env       []string
	ExtraArgs []string
	// ReadyTimeout bounds the wait for /readyz in Start (default 45s).
	ReadyTimeout time.Duration
	// ReadyAfter is how long the last Start took from starting the process
	// to /readyz answering 200 (and the TLS handshake succeeding).
	ReadyAfter time.Duration

	logDir string
	proc   *process
	admin  *http.Client
}

// GuardConfig says which binary to run and where its files go.
type GuardConfig struct {
	Bin        string   // gpu-deploy-guard executable
	Dir        string   // created if missing
	LogDir     string   // gpu-deploy-guard.log goes here (ControlPlane.LogDir: dumped on failure)
	ConfigFile string   // optional --config
	Name       string   // log file <LogDir>/<Name>.log; default gpu-deploy-guard
	Env        []string // added to the environment of serve, e.g. KUBECONFIG=<path>
	ExtraArgs  []string // added to serve's arguments, e.g. --report
	// IP the HTTPS listener binds and the certificate names; default
	// 127.0.0.1. The API server speaks HTTP/2 to a loopback URL but only
	// HTTP/1.1 to any other address (and to a Service), so a local
	// non-loopback address gives the protocol a real cluster sees.
	IP string
	// ReadyTimeout bounds the wait for /readyz; default 45s. A cluster
	// watch over a large fleet may need longer for its first sync.
	ReadyTimeout time.Duration
}

// StartGuard makes certificates with `gpu-deploy-guard certs`, picks two free
// loopback ports and starts `gpu-deploy-guard serve` on them. It returns once
// /readyz answers 200 and the HTTPS port presents a certificate that
// verifies against CABundle for the guard's IP.
func StartGuard(cfg GuardConfig) (*Guard, error) {
	g := &Guard{Bin: cfg.Bin, Dir: cfg.Dir, ConfigFile: cfg.ConfigFile, logDir: cfg.LogDir,
		Name: cfg.Name, Env: cfg.Env, ExtraArgs: cfg.ExtraArgs, IP: cfg.IP, ReadyTimeout: cfg.ReadyTimeout,
		admin: &http.Client{Timeout: 5 * time.Second}}
	if g.Name == "" {
		g.Name = "gpu-deploy-guard"
	}
	if g.IP == "" {
		g.IP = "127.0.0.1"
	}
	if err := os.MkdirAll(g.certsDir(), 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command(g.Bin, "certs", "--out", g.certsDir(), "--ip", g.IP, "--dns", "localhost")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s certs: %v\nstderr:\n%s", g.Bin, err, stderr.String())
	}
	bundle, err := base64.StdEncoding.DecodeString(strings.TrimSpace(stdout.String()))
	if err != nil {
		return nil, fmt.Errorf("%s certs printed %q, not a base64 caBundle: %v", g.Bin, stdout.String(), err)
	}
	caFile, err := os.ReadFile(filepath.Join(g.certsDir(), "ca.crt"))
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(bundle, caFile) {
		return nil, fmt.Errorf("%s certs: printed caBundle is not the ca.crt it wrote:\nprinted:\n%s\nca.crt:\n%s", g.Bin, bundle, caFile)
	}
	g.CABundle = bundle
	if g.Port, err = freePort(); err != nil {
		return nil, err
	}
	if g.AdminPort, err = freePort(); err != nil {
		return nil, err
	}
	if err := g.Start(); err != nil {
		return g, err
	}
	return g, nil
}

func (g *Guard) certsDir() string { return filepath.Join(g.Dir, "certs") }

// URL is what the webhook configuration's clientConfig.url must say.
func (g *Guard) URL() string {
	return "https://" + net.JoinHostPort(g.IP, strconv.Itoa(g.Port)) + "/validate"
}

// Pid is the serve process's id, 0 when it is not running.
func (g *Guard) Pid() int {
	if !g.Running() {
		return 0
	}
	return g.proc.cmd.Process.Pid
}

// Signal sends sig to the serve process: SIGSTOP freezes the replica (a
// node under memory pressure, a stuck VM), SIGCONT thaws it.
func (g *Guard) Signal(sig syscall.Signal) error {
	pid := g.Pid()
	if pid == 0 {
		return fmt.Errorf("%s is not running", g.Name)
	}
	return syscall.Kill(pid, sig)
}

// AdminURL is the base of /readyz and /metrics.
func (g *Guard) AdminURL() string { return "http://127.0.0.1:" + strconv.Itoa(g.AdminPort) }

// Running reports whether the serve process is up.
func (g *Guard) Running() bool {
	if g == nil || g.proc == nil {
		return false
	}
	gone, _ := g.proc.exited()
	return !gone
}

// Start (re)starts `serve` on the guard's ports. A restarted process has
// fresh metrics.
func (g *Guard) Start() error {
	if g.Running() {
		return fmt.Errorf("gpu-deploy-guard already running (pid %d)", g.proc.cmd.Process.Pid)
	}
	args := []string{"serve",
		"--listen", net.JoinHostPort(g.IP, strconv.Itoa(g.Port)),
		"--admin-listen", "127.0.0.1:" + strconv.Itoa(g.AdminPort),
		"--tls-cert", filepath.Join(g.certsDir(), "tls.crt"),
		"--tls-key", filepath.Join(g.certsDir(), "tls.key"),
		// Tests stop it to see the failurePolicy at work; no Service
		// endpoints have to be drained first.
		"--shutdown-delay", "0s",
	}
	if g.ConfigFile != "" {
		args = append(args, "--config", g.ConfigFile)
	}
	args = append(args, g.ExtraArgs...)
	started := time.Now()
	p, err := startProcessEnv(g.Name, g.Bin, args, g.Env, g.logDir)
	if err != nil {
		return err
	}
	g.proc = p
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(g.CABundle) {
		return fmt.Errorf("caBundle holds no PEM certificate")
	}
	// With the cluster watch on, /readyz waits for the first sync, which
	// serve bounds at 30s; allow that plus its debounce.
	timeout := g.ReadyTimeout
	if timeout <= 0 {
		timeout = 45 * time.Second
	}
	err = waitHealthy(p, timeout, func() (bool, string) {
		if ok, status := httpOK(g.admin, g.AdminURL()+"/readyz", ""); !ok {
			return false, status
		}
		// What the API server will do: TLS to the IP, trusting only caBundle.
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", net.JoinHostPort(g.IP, strconv.Itoa(g.Port)),
			&tls.Config{RootCAs: pool, ServerName: g.IP})
		if err != nil {
			return false, "TLS handshake: " + err.Error()
		}
		conn.Close()
		return true, ""
	})
	g.ReadyAfter = time.Since(started)
	if err != nil {
		g.proc.stop(5 * time.Second)
	}
	return err
}

// Stop sends SIGTERM and waits for the process to exit (SIGKILL after 10s).
// Safe to call when it is not running.
func (g *Guard) Stop() {
	if g != nil && g.proc != nil {
		g.proc.stop(10 * time.Second)
	}
}

// Kill ends the serve process with SIGKILL: no drain, no Lease handed over,
// as when its node dies.
func (g *Guard) Kill() {
	if g != nil && g.proc != nil {
		g.proc.kill()
	}
}

// LogPath is the serve process's log file.
func (g *Guard) LogPath() string { return filepath.Join(g.logDir, g.Name+".log") }

// Sample is one line of the Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics fetches /metrics and parses every sample in it.
func (g *Guard) Metrics() ([]Sample, error) {
	text, err := g.MetricsText()
	if err != nil {
		return nil, err
	}
	return ParseMetrics(text)
}

// MetricsText fetches /metrics as it is.
func (g *Guard) MetricsText() (string, error) {
	resp, err := g.admin.Get(g.AdminURL() + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %d %s", resp.StatusCode, body)
	}
	return string(body), nil
}

// Counter sums the samples named name whose labels include every pair in
// match (a missing series counts 0, as Prometheus would).
func (g *Guard) Counter(name string, match map[string]string) (float64, error) {
	samples, err := g.Metrics()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, s := range samples {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			ok = ok && s.Labels[k] == v
		}
		if ok {
			sum += s.Value
		}
	}
	return sum, nil
}

// ParseMetrics reads the Prometheus/OpenMetrics text format: comment lines
// are skipped; label values may not contain `",` or `}` (ours never do).
func ParseMetrics(text string) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := Sample{Labels: map[string]string{}}
		rest := line
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("metrics line %q: unbalanced braces", line)
			}
			s.Name = line[:i]
			for _, pair := range strings.Split(line[i+1:j], ",") {
				if pair == "" {
					continue
				}
				k, v, ok := strings.Cut(pair, "=")
				if !ok {
					return nil, fmt.Errorf("metrics line %q: bad label %q", line, pair)
				}
				s.Labels[k] = strings.Trim(v, `"`)
			}
			rest = strings.TrimSpace(line[j+1:])
		} else {
			name, value, _ := strings.Cut(line, " ")
			s.Name, rest = name, value
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		s.Value = v
		out = append(out, s)
	}
	return out, sc.Err()
}
