// Command benchconns measures what each kind of webhook connection costs `serve` in resident
// memory, so that --max-connections can be sized against the Deployment's memory limit.
//
// For each kind and count it starts a fresh `serve` (with the chart's GLIBC_TUNABLES), opens
// that many connections of the kind from 127.0.0.9, waits for the server to settle and reads
// VmRSS from /proc. Kinds:
//
//	silent    TCP connections that never start TLS
//	idle-h1   TLS HTTP/1.1 keep-alive connections, idle after one answered request
//	idle-h2   TLS HTTP/2 connections, idle after one answered request
//	held-h2   TLS HTTP/2 connections, each with one request whose body never ends
//
// It prints one line per run and the cost per connection in KiB.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
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

	"gpu-deploy-guard/tests/e2e/framework"
)

var attacker = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9)}

func main() {
	bin := flag.String("bin", "target/release/gpu-deploy-guard", "gpu-deploy-guard binary")
	values := flag.String("chart-values", "deploy/helm/gpu-deploy-guard/values.yaml", "the chart's values (mallocTunables)")
	counts := flag.String("counts", "64,256", "connection counts, comma-separated")
	kinds := flag.String("kinds", "silent,idle-h1,idle-h2,held-h2", "connection kinds, comma-separated")
	flag.Parse()
	tunables, err := framework.ChartMallocTunables(*values)
	if err != nil {
		fail(err)
	}
	fmt.Printf("%-8s %6s %10s %10s %8s\n", "kind", "conns", "RSS before", "RSS after", "KiB/conn")
	for _, kind := range strings.Split(*kinds, ",") {
		for _, c := range strings.Split(*counts, ",") {
			n, err := strconv.Atoi(c)
			if err != nil || n < 1 {
				fail(fmt.Errorf("bad count %q", c))
			}
			before, after, err := measure(*bin, tunables, kind, n)
			if err != nil {
				fail(fmt.Errorf("%s × %d: %w", kind, n, err))
			}
			fmt.Printf("%-8s %6d %7.1f MiB %7.1f MiB %8.1f\n", kind, n,
				float64(before)/1024, float64(after)/1024, float64(after-before)/float64(n))
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchconns:", err)
	os.Exit(1)
}

// measure returns serve's VmRSS in KiB before and after n connections of kind.
func measure(bin, tunables, kind string, n int) (before, after int64, err error) {
	dir, err := os.MkdirTemp("", "benchconns")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	port, err := framework.FreePort()
	if err != nil {
		return 0, 0, err
	}
	admin, err := framework.FreePort()
	if err != nil {
		return 0, 0, err
	}
	caPath := filepath.Join(dir, "ca.pem")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "serve", "--no-cluster-watch",
		"--listen", addr, "--admin-listen", fmt.Sprintf("127.0.0.1:%d", admin),
		"--write-ca", caPath, "--max-connections", strconv.Itoa(n+16),
		"--max-requests-per-source", strconv.Itoa(n+16), "--log-format", "json")
	cmd.Env = append(os.Environ(), "RUST_LOG=warn", "GLIBC_TUNABLES="+tunables)
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ready := fmt.Sprintf("http://127.0.0.1:%d/readyz", admin)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("serve not ready in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	pem, err := os.ReadFile(caPath)
	if err != nil {
		return 0, 0, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	time.Sleep(500 * time.Millisecond)
	pid := cmd.Process.Pid
	if before, err = rss(pid); err != nil {
		return 0, 0, err
	}
	var hold []io.Closer
	defer func() {
		for _, c := range hold {
			c.Close()
		}
	}()
	dialer := &net.Dialer{LocalAddr: attacker, Timeout: 5 * time.Second}
	for i := 0; i < n; i++ {
		if kind == "silent" {
			conn, err := dialer.Dial("tcp", addr)
			if err != nil {
				return 0, 0, err
			}
			hold = append(hold, conn)
			continue
		}
		h2 := kind != "idle-h1"
		tr := &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "localhost"},
			ForceAttemptHTTP2: h2,
			DialContext:       dialer.DialContext,
			IdleConnTimeout:   time.Hour,
		}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		client := &http.Client{Transport: tr}
		switch kind {
		case "idle-h1", "idle-h2":
			resp, err := client.Get("https://" + addr + "/idle")
			if err != nil {
				return 0, 0, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		case "held-h2":
			body, w := io.Pipe()
			hold = append(hold, w)
			go func() { _, _ = w.Write([]byte("{")) }()
			req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/validate", body)
			req.ContentLength = 1000
			req.Header.Set("Content-Type", "application/json")
			go func() {
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		default:
			return 0, 0, fmt.Errorf("unknown kind %q", kind)
		}
		hold = append(hold, closer(tr.CloseIdleConnections))
	}
	// Held requests would time out after the body timeout (5 s): measure before.
	time.Sleep(2 * time.Second)
	after, err = rss(pid)
	return before, after, err
}

type closer func()

func (c closer) Close() error { c(); return nil }

func rss(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}
