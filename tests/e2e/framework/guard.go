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
	"time"
)

// Guard is a running `gpu-deploy-guard serve` (the product binary), with a
// serving certificate made by `gpu-deploy-guard certs` for 127.0.0.1. The
// API server reaches it at URL(); there is no Service in between.
type Guard struct {
	Bin        string
	Dir        string // certs/ (ca.crt, tls.crt, tls.key) and whatever the caller put there
	ConfigFile string // passed as --config; empty: the binary's defaults
	Port       int    // HTTPS, POST /validate
	AdminPort  int    // plain HTTP: /readyz, /metrics
	// CABundle is the PEM CA the API server must trust: the base64 text
	// `certs` printed, decoded (and checked to equal the ca.crt it wrote).
	CABundle []byte

	logDir string
	proc   *process
	admin  *http.Client
}

// GuardConfig says which binary to run and where its files go.
type GuardConfig struct {
	Bin        string // gpu-deploy-guard executable
	Dir        string // created if missing
	LogDir     string // gpu-deploy-guard.log goes here (ControlPlane.LogDir: dumped on failure)
	ConfigFile string // optional --config
}

// StartGuard makes certificates with `gpu-deploy-guard certs`, picks two free
// loopback ports and starts `gpu-deploy-guard serve` on them. It returns once
// /readyz answers 200 and the HTTPS port presents a certificate that
// verifies against CABundle for 127.0.0.1.
func StartGuard(cfg GuardConfig) (*Guard, error) {
	g := &Guard{Bin: cfg.Bin, Dir: cfg.Dir, ConfigFile: cfg.ConfigFile, logDir: cfg.LogDir,
		admin: &http.Client{Timeout: 5 * time.Second}}
	if err := os.MkdirAll(g.certsDir(), 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command(g.Bin, "certs", "--out", g.certsDir(), "--ip", "127.0.0.1", "--dns", "localhost")
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
func (g *Guard) URL() string { return "https://127.0.0.1:" + strconv.Itoa(g.Port) + "/validate" }

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
		"--listen", "127.0.0.1:" + strconv.Itoa(g.Port),
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
	p, err := startProcess("gpu-deploy-guard", g.Bin, args, g.logDir)
	if err != nil {
		return err
	}
	g.proc = p
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(g.CABundle) {
		return fmt.Errorf("caBundle holds no PEM certificate")
	}
	err = waitHealthy(p, 30*time.Second, func() (bool, string) {
		if ok, status := httpOK(g.admin, g.AdminURL()+"/readyz", ""); !ok {
			return false, status
		}
		// What the API server will do: TLS to 127.0.0.1, trusting only caBundle.
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", "127.0.0.1:"+strconv.Itoa(g.Port),
			&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			return false, "TLS handshake: " + err.Error()
		}
		conn.Close()
		return true, ""
	})
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

// LogPath is the serve process's log file.
func (g *Guard) LogPath() string { return filepath.Join(g.logDir, "gpu-deploy-guard.log") }

// Sample is one line of the Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics fetches /metrics and parses every sample in it.
func (g *Guard) Metrics() ([]Sample, error) {
	resp, err := g.admin.Get(g.AdminURL() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %d %s", resp.StatusCode, body)
	}
	return ParseMetrics(string(body))
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
