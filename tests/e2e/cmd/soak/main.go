// Command soak runs `gpu-deploy-guard serve` for a long time under a fixed rate of mixed good,
// bad and hostile reviews while its serving certificate is rotated every minute, and checks
// that it stayed correct and bounded:
//
//   - every good review was answered 200 with the decision it got when the run started;
//   - every bad or hostile request was refused with a 4xx naming the problem, or answered;
//   - resident memory stayed flat (the last minutes against the first after warm-up) and
//     under the Deployment's 64 MiB limit;
//   - the webhook's metrics count exactly the reviews and bad requests that were sent;
//   - every rotation was loaded (tls_certificate_reloads_total{result="success"}).
//
// With -attack (issue 21's mix, `make soak` sets it) a second client source, 127.0.0.9, also
// holds silent TCP connections, idle HTTP/2 connections answering PINGs and idle keep-alive
// connections to the admin port, and opens HTTP/2 streams that declare 3.5 MiB and send
// nothing; the hostile bodies include 3.4 MB reviews with wrongly typed U+0085 strings, 80,000
// unknown labels and ClusterPolicy reviews of 150,000 small fields. Then /livez and /readyz,
// probed every second as the kubelet does, must never fail, and the peak must stay under
// -rss-limit-mib (`make soak`: the Deployment's 64).
//
// serve runs with the chart's GLIBC_TUNABLES (mallocTunables in -chart-values).
//
// It prints its figures and exits 1 if any check fails. `make soak` runs it for ten minutes.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// The attackers' source address: a loopback address of its own, so that the server sees two
// client sources.
var attackerIP = net.ParseIP("127.0.0.9")

func main() {
	bin := flag.String("bin", "target/release/gpu-deploy-guard", "gpu-deploy-guard binary")
	fixtures := flag.String("fixtures", "tests/fixtures/reviews", "AdmissionReview fixtures")
	duration := flag.Duration("duration", 10*time.Minute, "how long to send load")
	rate := flag.Int("rate", 200, "requests per second, all kinds together")
	rotate := flag.Duration("rotate", time.Minute, "certificate rotation interval")
	attack := flag.Bool("attack", false, "add issue 21's connection and body attacks from 127.0.0.9")
	shares := flag.Bool("share-attacks", false, "with -attack: also hold a request open on every connection and stall 1 MiB bodies, against the per-source shares")
	rssLimit := flag.Int64("rss-limit-mib", 64, "peak RSS limit in MiB")
	values := flag.String("chart-values", "deploy/helm/gpu-deploy-guard/values.yaml", "the chart's values (mallocTunables)")
	flag.Parse()
	opts := options{attack: *attack, shareAttacks: *shares, rssLimit: *rssLimit << 20, chartValues: *values}
	if err := run(*bin, *fixtures, *duration, *rate, *rotate, opts); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// A request the load sends, and what it must get.
type kind struct {
	name  string
	class string // good, bad or hostile
	body  []byte
	ctype string
	// For good reviews: the allowed value seen before the load started.
	allowed *bool
	// For bad and hostile ones: the statuses that are a correct answer.
	statuses []int
	// The server answers (413) before the body is sent and closes: the client may see its
	// write fail instead of the answer. The server still counts the request.
	refusedEarly bool
	// The path it is sent to; "" is /validate.
	path string
	// A hostile body large enough (over 128 KiB) to wait among the large ones: when the
	// client's part of that room is full it is shed with a 503 that says so, a correct
	// answer; set for every hostile kind of that size.
	mayShed bool
}

// shedWaiting: what a 503 for a body with no room left to wait says.
const shedWaiting = "nor to wait for it"

type options struct {
	attack       bool
	shareAttacks bool
	rssLimit     int64
	chartValues  string
}

type tally struct {
	sent, failed atomic.Int64
	byStatus     sync.Map // int -> *atomic.Int64
	firstFailure atomic.Value
}

func (t *tally) status(code int) {
	v, _ := t.byStatus.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (t *tally) count(code int) int64 {
	v, ok := t.byStatus.Load(code)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func (t *tally) fail(what string) {
	t.failed.Add(1)
	t.firstFailure.CompareAndSwap(nil, what)
}

func run(bin, fixtures string, duration time.Duration, rate int, rotateEvery time.Duration, opts options) error {
	tunables, err := framework.ChartMallocTunables(opts.chartValues)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "gdg-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ca, err := newCA()
	if err != nil {
		return err
	}
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := ca.writeLeaf(certPath, keyPath); err != nil {
		return err
	}
	port, admin := freePort(), freePort()
	logPath := filepath.Join(dir, "serve.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "serve", "--no-cluster-watch",
		"--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--admin-listen", fmt.Sprintf("127.0.0.1:%d", admin),
		"--tls-cert", certPath, "--tls-key", keyPath,
		"--tls-reload-interval", "2s", "--shutdown-delay", "0s")
	cmd.Env = append(os.Environ(), "RUST_LOG=warn", "GLIBC_TUNABLES="+tunables)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() }()
	pid := cmd.Process.Pid
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", admin)
	if err := waitReady(adminURL); err != nil {
		return fmt.Errorf("%v; log:\n%s", err, readFile(logPath))
	}

	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	url := base + "/validate"
	clients := []*http.Client{ca.client(true), ca.client(false)}
	kinds, err := loadKinds(fixtures, opts.attack)
	if err != nil {
		return err
	}
	// The decision each good review gets on a quiet server is what it must keep getting.
	for i := range kinds {
		k := &kinds[i]
		if k.class != "good" {
			continue
		}
		code, allowed, _, err := send(clients[0], url, k)
		if err != nil || code != 200 || allowed == nil {
			return fmt.Errorf("%s: baseline answer %d %v", k.name, code, err)
		}
		k.allowed = allowed
	}
	baseline := scrape(adminURL)

	fmt.Printf("soak: %s at %d requests/s, certificate rotated every %s; serve pid %d\n",
		duration, rate, rotateEvery, pid)
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()

	var rotations atomic.Int64
	go func() {
		t := time.NewTicker(rotateEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := ca.writeLeaf(certPath, keyPath); err != nil {
					fmt.Fprintln(os.Stderr, "rotation:", err)
					continue
				}
				rotations.Add(1)
			}
		}
	}()

	var rss []sample
	var rssMu sync.Mutex
	go func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if v, err := procStatus(pid, "VmRSS:"); err == nil {
					rssMu.Lock()
					rss = append(rss, sample{time.Since(start), v})
					rssMu.Unlock()
				}
			}
		}
	}()

	// Hostile connections besides the requests: a slowloris head every 5 s, cut by the
	// header timeout, and an idle HTTP/2 connection that answers PINGs, every 30 s.
	go hostileConnections(ctx, port, ca)
	var probes probeTally
	if opts.attack {
		go attackConnections(ctx, port, admin, ca, opts.shareAttacks)
	}
	go probe(ctx, adminURL, &probes)

	tallies := map[string]*tally{"good": {}, "bad": {}, "hostile": {}}
	// 200 answers of GPU-policy reviews: counted apart from node reviews.
	var policy200 atomic.Int64
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	ticker := time.NewTicker(interval)
	var n int
	// Weighted: 8 good, 1 bad, 1 hostile in every 10.
	byClass := map[string][]*kind{}
	for i := range kinds {
		byClass[kinds[i].class] = append(byClass[kinds[i].class], &kinds[i])
	}
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-ticker.C:
		}
		class := "good"
		switch n % 10 {
		case 4:
			class = "bad"
		case 9:
			class = "hostile"
		}
		list := byClass[class]
		k := list[(n/10)%len(list)]
		client := clients[n%2]
		n++
		t := tallies[class]
		t.sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			target := url
			if k.path != "" {
				target = base + k.path
			}
			code, allowed, said, err := send(client, target, k)
			if code == 200 && k.path != "" {
				policy200.Add(1)
			}
			if err != nil && k.refusedEarly {
				code, err = 413, nil
			}
			if err != nil {
				t.fail(fmt.Sprintf("%s: %v", k.name, err))
				return
			}
			t.status(code)
			if k.class == "good" {
				if code != 200 || allowed == nil || *allowed != *k.allowed {
					t.fail(fmt.Sprintf("%s: status %d allowed %v %s", k.name, code, allowed, said))
				}
				return
			}
			for _, s := range k.statuses {
				if s == code {
					return
				}
			}
			if code == 503 && k.mayShed && strings.Contains(said, shedWaiting) {
				return
			}
			t.fail(fmt.Sprintf("%s: status %d, want one of %v %s", k.name, code, k.statuses, said))
		}()
	}
	ticker.Stop()
	wg.Wait()
	time.Sleep(3 * time.Second) // a last rotation poll
	final := scrape(adminURL)
	peak, _ := procStatus(pid, "VmHWM:")

	failed := false
	check := func(ok bool, format string, args ...any) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
			failed = true
		}
		fmt.Printf("%s %s\n", mark, fmt.Sprintf(format, args...))
	}
	var total200, total4xx int64
	for _, class := range []string{"good", "bad", "hostile"} {
		t := tallies[class]
		var codes []string
		for _, code := range []int{200, 400, 404, 408, 413, 415} {
			c := t.count(code)
			if code == 200 {
				total200 += c
			} else if code != 404 {
				total4xx += c
			}
			if c > 0 {
				codes = append(codes, fmt.Sprintf("%d×%d", c, code))
			}
		}
		first, _ := t.firstFailure.Load().(string)
		check(t.failed.Load() == 0, "%-7s sent %d, failed %d (%s) %s",
			class, t.sent.Load(), t.failed.Load(), strings.Join(codes, " "), first)
	}
	reviews := final.sum("gpu_deploy_guard_admission_reviews_total") -
		baseline.sum("gpu_deploy_guard_admission_reviews_total")
	bad := final.sum("gpu_deploy_guard_admission_bad_requests_total") -
		baseline.sum("gpu_deploy_guard_admission_bad_requests_total")
	check(int64(reviews) == total200-policy200.Load(), "metrics: %d reviews counted, %d answered 200", int64(reviews), total200-policy200.Load())
	if opts.attack {
		policyReviews := final.sum("gpu_deploy_guard_policy_reviews_total") - baseline.sum("gpu_deploy_guard_policy_reviews_total")
		check(int64(policyReviews) == policy200.Load(), "metrics: %d policy reviews counted, %d answered 200", int64(policyReviews), policy200.Load())
		evicted := final.sum("gpu_deploy_guard_connection_pool_evictions_total")
		fmt.Printf("     connection pools: %.0f connections closed to make room\n", evicted)
	}
	check(probes.failed.Load() == 0, "probes: %d of /livez and /readyz, %d failed %s",
		probes.sent.Load(), probes.failed.Load(), probes.first())
	if opts.attack {
		// The attackers' streams that declare a body and send none or part of it end as
		// body-read errors (the client gave up) or body timeouts, and those beyond their
		// source's share as 503s; they are not in the tallies.
		reasons := func(names ...string) float64 {
			var n float64
			for _, reason := range names {
				series := `gpu_deploy_guard_admission_bad_requests_total{reason="` + reason + `"}`
				n += final.sum(series) - baseline.sum(series)
			}
			return n
		}
		unsent := reasons("body-read", "body-timeout")
		overShare := reasons("source-requests", "source-bytes", "busy", "too-many-waiting")
		fmt.Printf("     attackers' unsent bodies: %.0f refused; beyond their share (503): %.0f\n", unsent, overShare)
		bad -= unsent + overShare
	}
	check(int64(bad) == total4xx, "metrics: %d bad requests counted, %d refused with a 4xx", int64(bad), total4xx)
	reloads := final.sum(`gpu_deploy_guard_tls_certificate_reloads_total{result="success"}`)
	check(int64(reloads) == rotations.Load(), "certificate: %d rotations, %d loaded, %d failed",
		rotations.Load(), int64(reloads), int64(final.sum(`gpu_deploy_guard_tls_certificate_reloads_total{result="failure"}`)))

	rssMu.Lock()
	early, late := window(rss, duration/10, duration*3/10), window(rss, duration*7/10, duration)
	rssMu.Unlock()
	check(late <= early*11/10+2<<20, "RSS flat: median %.1f MiB after warm-up, %.1f MiB at the end",
		mib(early), mib(late))
	check(peak < opts.rssLimit, "RSS peak %.1f MiB (limit %.0f MiB)", mib(peak), mib(opts.rssLimit))
	if failed {
		return fmt.Errorf("checks failed; serve log: %s", tail(readFile(logPath), 20))
	}
	return nil
}

type sample struct {
	at  time.Duration
	rss int64
}

// The median RSS of the samples taken in [from, to).
func window(samples []sample, from, to time.Duration) int64 {
	var in []int64
	for _, s := range samples {
		if s.at >= from && s.at < to {
			in = append(in, s.rss)
		}
	}
	if len(in) == 0 {
		return 0
	}
	sort.Slice(in, func(i, j int) bool { return in[i] < in[j] })
	return in[len(in)/2]
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// send posts k: the status, the decision of a 200, and else what the answer says (cut short).
func send(client *http.Client, url string, k *kind) (int, *bool, string, error) {
	ctype := k.ctype
	if ctype == "" {
		ctype = "application/json"
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(k.body))
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, nil, "", err
	}
	var review struct {
		Response *struct {
			Allowed bool `json:"allowed"`
			Status  struct {
				Message string `json:"message"`
			} `json:"status"`
		} `json:"response"`
	}
	if json.Unmarshal(body, &review) == nil && review.Response != nil {
		if resp.StatusCode == 200 {
			return resp.StatusCode, &review.Response.Allowed, "", nil
		}
		body = []byte(review.Response.Status.Message)
	}
	if len(body) > 200 {
		body = body[:200]
	}
	return resp.StatusCode, nil, string(body), nil
}

// The request mix: the good and bad fixtures, and hostile requests built here.
func loadKinds(dir string, attack bool) ([]kind, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var kinds []kind
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		body, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		k := kind{name: e.Name(), class: "good", body: body}
		if strings.HasPrefix(e.Name(), "bad-") {
			k.class, k.statuses = "bad", []int{400}
		}
		kinds = append(kinds, k)
	}
	review := func(name string, labels map[string]string) []byte {
		b, _ := json.Marshal(map[string]any{
			"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
			"request": map[string]any{
				"uid":       "soak",
				"kind":      map[string]string{"group": "", "version": "v1", "kind": "Node"},
				"name":      name,
				"operation": "UPDATE",
				"userInfo":  map[string]any{"username": "soak"},
				"object":    map[string]any{"metadata": map[string]any{"name": name, "labels": labels}},
				"oldObject": map[string]any{"metadata": map[string]any{"name": name}},
			},
		})
		return b
	}
	unknown := map[string]string{}
	for i := 0; i < 2000; i++ {
		unknown[fmt.Sprintf("nvidia.com/gpu.deploy.unknown-%d", i)] = "true"
	}
	hostile := []kind{
		{name: "long-name", body: review(strings.Repeat("n", 256*1024), map[string]string{"a": "b"}), statuses: []int{400}},
		{name: "2000-unknown-keys", body: review("n", unknown), statuses: []int{200}},
		{name: "long-key", body: review("n", map[string]string{"nvidia.com/gpu.deploy." + strings.Repeat("x", 512*1024): "true"}), statuses: []int{400}},
		{name: "long-value", body: review("n", map[string]string{"nvidia.com/gpu.deploy.driver": strings.Repeat("v", 100000)}), statuses: []int{400}},
		{name: "big-bad-kind", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"` + strings.Repeat("k", 1<<20) + `"}`), statuses: []int{400}},
		{name: "truncated", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x"`), statuses: []int{400}},
		{name: "deep-nesting", body: []byte(strings.Repeat("[", 100000)), statuses: []int{400}},
		{name: "wrong-content-type", body: []byte(`{}`), ctype: "text/plain", statuses: []int{415}},
		{name: "over-the-body-limit", body: bytes.Repeat([]byte(" "), 9<<20), statuses: []int{413}, refusedEarly: true},
	}
	if attack {
		hostile = append(hostile, attackKinds(review)...)
	}
	for _, k := range hostile {
		k.class = "hostile"
		k.mayShed = len(k.body) > 128<<10
		kinds = append(kinds, k)
	}
	return kinds, nil
}

func hostileConnections(ctx context.Context, port int, ca *authority) {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	slow := time.NewTicker(5 * time.Second)
	defer slow.Stop()
	idle := time.NewTicker(30 * time.Second)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-slow.C:
			go func() {
				conn, err := tls.Dial("tcp", addr, ca.tlsConfig([]string{"http/1.1"}))
				if err != nil {
					return
				}
				defer conn.Close()
				_, _ = conn.Write([]byte("POST /validate HTTP/1.1\r\nHost: x\r\n"))
				_, _ = io.Copy(io.Discard, conn) // until the server cuts it
			}()
		case <-idle.C:
			go func() {
				client := ca.client(true)
				ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
				defer cancel()
				// A path the webhook answers 404: neither a review nor a bad request.
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/idle", nil)
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
				}
				// The connection stays in the pool and answers PINGs until the server ends it.
				<-ctx.Done()
				client.CloseIdleConnections()
			}()
		}
	}
}

// metrics: one scrape of /metrics, sample name (with labels) -> value.
type metrics map[string]float64

func scrape(admin string) metrics {
	m := metrics{}
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// The sum of every series of `name`, or of the one series when labels are given.
func (m metrics) sum(name string) float64 {
	var total float64
	for k, v := range m {
		if k == name || (!strings.Contains(name, "{") && strings.HasPrefix(k, name+"{")) {
			total += v
		}
	}
	return total
}

func waitReady(admin string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("serve not ready after 30s")
}

func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no %s", field)
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 300 {
			lines[i] = l[:300] + "…"
		}
	}
	return "\n" + strings.Join(lines, "\n")
}

// authority: the CA the soak's serving certificates come from.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "soak CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &authority{cert: cert, key: key, pool: pool}, nil
}

var serial atomic.Int64

// writeLeaf writes a fresh serving certificate and key, each by rename so that a reader never
// sees half a file (the server reads both and retries a mismatched pair).
func (a *authority) writeLeaf(certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1) + 1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	write := func(path, typ string, der []byte) error {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			return err
		}
		return os.Rename(tmp, path)
	}
	if err := write(keyPath, "PRIVATE KEY", keyDER); err != nil {
		return err
	}
	return write(certPath, "CERTIFICATE", der)
}

func (a *authority) tlsConfig(alpn []string) *tls.Config {
	return &tls.Config{RootCAs: a.pool, NextProtos: alpn, MinVersion: tls.VersionTLS12}
}

// client: an HTTPS client trusting the CA, over HTTP/2 or HTTP/1.1, keeping connections
// like the API server does.
func (a *authority) client(h2 bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:     a.tlsConfig(nil),
		ForceAttemptHTTP2:   h2,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}
