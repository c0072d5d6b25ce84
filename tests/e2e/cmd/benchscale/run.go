package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"gpu-deploy-guard/tests/e2e/framework"
)

const mib = 1024.0

// replicaResult is one serve process at one fleet size.
type replicaResult struct {
	Name          string   `json:"name"`
	ReadySeconds  float64  `json:"ready_seconds"`
	SettleSeconds float64  `json:"settle_seconds"`
	Settled       bool     `json:"settled"` // went quiet before -settle-max
	PeakSyncMiB   float64  `json:"peak_rss_first_sync_mib"`
	RSSSettledMiB float64  `json:"rss_settled_mib"`
	MetricsBytes  int      `json:"metrics_bytes"`
	MetricsSeries int      `json:"metrics_series"`
	AuditNodes    *float64 `json:"audit_nodes"`    // gpu_deploy_guard_audit_nodes
	Findings      float64  `json:"audit_findings"` // sum of gpu_deploy_guard_audit_findings
	Leader        *float64 `json:"leader"`         // the -leader-metric gauge, when exposed
	PeakScrapeMiB float64  `json:"peak_rss_after_scrape_mib"`
	CPURest       float64  `json:"cpu_rest_cores"`
	CPUHeartbeat  float64  `json:"cpu_heartbeat_cores"`
	PeakHBMiB     float64  `json:"peak_rss_after_heartbeats_mib"`
	RSSHBMiB      float64  `json:"rss_after_heartbeats_mib"`
	LogErrors     int      `json:"log_errors"`
	LogWarnings   int      `json:"log_warnings"`
	// The custom-resource flood (-cr-flood): large NVIDIADrivers and extra
	// ClusterPolicies created, then deleted.
	PeakFloodMiB    float64 `json:"peak_rss_cr_flood_mib"`
	RSSFloodMiB     float64 `json:"rss_cr_flood_mib"`
	RSSFloodGoneMiB float64 `json:"rss_cr_flood_deleted_mib"`
	// Node reviews sent to the replica every 50 ms from the flood's start to
	// its end.
	FloodReviews reviewStats `json:"reviews_during_cr_flood"`
}

// controlPlaneResult is the API server and etcd around the run.
type controlPlaneResult struct {
	APIServerRSSMiB      float64            `json:"apiserver_rss_mib"`
	APIServerPeakMiB     float64            `json:"apiserver_peak_rss_mib"`
	APIServerCPURest     float64            `json:"apiserver_cpu_rest_cores"`
	APIServerCPUHB       float64            `json:"apiserver_cpu_heartbeat_cores"`
	EtcdRSSMiB           float64            `json:"etcd_rss_mib"`
	EtcdDBBytes          float64            `json:"etcd_db_bytes"`
	Objects              map[string]float64 `json:"objects"`                           // apiserver_resource_objects
	ListsFromCache       map[string]float64 `json:"lists_from_watch_cache"`            // apiserver_cache_list_total delta while serve started, by resource
	ListsFromEtcd        map[string]float64 `json:"lists_from_etcd"`                   // etcd list requests in the same window
	ConsistentFromCache  map[string]float64 `json:"consistent_reads_from_watch_cache"` // apiserver_watch_cache_consistent_read_total{success="true",fallback="false"}, same window
	LoadAverageAtStart   string             `json:"loadavg_at_start"`                  // /proc/loadavg when the replicas started
	LoadAverageQuietEnd  string             `json:"loadavg_after_quiet"`               // and after the quiet window
	LoadAverageHBEnd     string             `json:"loadavg_after_heartbeats"`          // and after the heartbeats
	WatchCacheCapacities map[string]float64 `json:"watch_cache_capacity"`              // apiserver_watch_cache_capacity
}

type runResult struct {
	Nodes        int                `json:"nodes"`
	Pods         int                `json:"pods"`
	Fill         fillStats          `json:"fill"`
	Replicas     []replicaResult    `json:"replicas"`
	Heartbeats   heartbeatStats     `json:"heartbeats"`
	Audit        auditRun           `json:"audit"`
	ControlPlane controlPlaneResult `json:"control_plane"`
}

func loadavg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return ""
}

func mem(pid int) (hwm, rss float64) {
	h, r, err := memKiB(pid)
	if err != nil {
		return 0, 0
	}
	return float64(h) / mib, float64(r) / mib
}

func measure(ctx context.Context, o options, cp *framework.ControlPlane, cs *kubernetes.Clientset, s *setup, f *fleet, n int) (runResult, error) {
	r := runResult{Nodes: n, Pods: n * len(f.dsets)}
	api := cp.Pids()["kube-apiserver"]
	etcd := cp.Pids()["etcd"]
	before, _ := apiMetrics(ctx, cs)
	r.ControlPlane.LoadAverageAtStart = loadavg()

	logf("N=%d: starting %d replicas of serve", n, o.replicas)
	guards, err := startReplicas(cp, o, s, o.bin, n)
	if err != nil {
		return r, err
	}
	defer func() {
		for _, g := range guards {
			g.Stop()
		}
	}()
	pids := make([]int, len(guards))
	r.Replicas = make([]replicaResult, len(guards))
	for i, g := range guards {
		pids[i] = g.Pid()
		r.Replicas[i] = replicaResult{Name: fmt.Sprintf("replica-%d", i), ReadySeconds: g.ReadyAfter.Seconds()}
		logf("N=%d: %s ready after %.1f s (pid %d, log %s)", n, r.Replicas[i].Name, g.ReadyAfter.Seconds(), pids[i], g.LogPath())
	}

	// After the first sync: wait until both are quiet (the first audit and
	// whatever follows it done), without asking them anything.
	var waited time.Duration
	quiet := true
	if len(pids) > 0 {
		if waited, quiet, err = waitQuiet(pids, o.settleMin, o.settleMax, 0.02); err != nil {
			return r, err
		}
	}
	after, _ := apiMetrics(ctx, cs)
	for i, pid := range pids {
		rr := &r.Replicas[i]
		rr.SettleSeconds, rr.Settled = waited.Seconds(), quiet
		rr.PeakSyncMiB, rr.RSSSettledMiB = mem(pid)
	}
	logf("N=%d: replicas quiet=%v after %.0f s", n, quiet, waited.Seconds())

	// One scrape each, on the clean fleet.
	for i, g := range guards {
		rr := &r.Replicas[i]
		text, err := g.MetricsText()
		if err != nil {
			return r, fmt.Errorf("%s /metrics: %w", rr.Name, err)
		}
		rr.MetricsBytes = len(text)
		samples, err := framework.ParseMetrics(text)
		if err != nil {
			return r, fmt.Errorf("%s /metrics: %w", rr.Name, err)
		}
		rr.MetricsSeries = len(samples)
		for _, sm := range samples {
			switch sm.Name {
			case "gpu_deploy_guard_audit_nodes":
				rr.AuditNodes = ptr(sm.Value)
			case "gpu_deploy_guard_audit_findings":
				rr.Findings += sm.Value
			case o.leaderMetric:
				rr.Leader = ptr(sm.Value)
			}
		}
		rr.PeakScrapeMiB, _ = mem(pids[i])
	}
	time.Sleep(5 * time.Second) // the scrapes' work is done before the quiet window

	all := append(append([]int{}, pids...), api)
	cores, _, err := cpuWindow(all, o.quiet, nil)
	if err != nil {
		return r, err
	}
	for i := range pids {
		r.Replicas[i].CPURest = cores[i]
	}
	r.ControlPlane.APIServerCPURest = cores[len(pids)]
	r.ControlPlane.LoadAverageQuietEnd = loadavg()
	logf("N=%d: CPU at rest %v cores (apiserver last)", n, cores)

	rate := float64(n) / o.hbPeriod.Seconds()
	logf("N=%d: %.1f node status heartbeats/s for %s", n, rate, o.heartbeat)
	cores, _, err = cpuWindow(all, 0, func() {
		r.Heartbeats = heartbeats(ctx, f.cs, n, rate, o.heartbeat, o.hbWorkers)
	})
	if err != nil {
		return r, err
	}
	r.ControlPlane.LoadAverageHBEnd = loadavg()
	for i, pid := range pids {
		rr := &r.Replicas[i]
		rr.CPUHeartbeat = cores[i]
		rr.PeakHBMiB, rr.RSSHBMiB = mem(pid)
	}
	r.ControlPlane.APIServerCPUHB = cores[len(pids)]
	logf("N=%d: heartbeats %d sent, %d failed, %d late; CPU %v cores", n, r.Heartbeats.Sent, r.Heartbeats.Failed, r.Heartbeats.Late, cores)

	if o.crFlood > 0 && len(pids) > 0 {
		probes := make([]*probe, len(guards))
		for i, g := range guards {
			probes[i] = startProbe(g.URL(), s.review, 50*time.Millisecond)
		}
		err := crFlood(cp, o, n, pids, r.Replicas)
		for i, p := range probes {
			r.Replicas[i].FloodReviews = p.finish()
		}
		if err != nil {
			return r, err
		}
	}

	for i, g := range guards {
		if !g.Running() {
			return r, fmt.Errorf("%s exited during the run; see %s", r.Replicas[i].Name, g.LogPath())
		}
	}
	for _, g := range guards {
		g.Stop()
	}
	for i, g := range guards {
		r.Replicas[i].LogErrors, r.Replicas[i].LogWarnings = logLevels(g.LogPath())
	}

	if o.bin != "" {
		logf("N=%d: gpu-deploy-guard audit of the cluster", n)
		if r.Audit, err = runAudit(o.bin, s.kubeconfig, s.config, o.auditTimeout); err != nil {
			return r, fmt.Errorf("audit: %w", err)
		}
		logf("N=%d: audit exit %d in %.1f s, peak RSS %.0f MiB", n, r.Audit.ExitCode, r.Audit.Seconds, float64(r.Audit.MaxRSSKiB)/mib)
	}

	cpr := &r.ControlPlane
	cpr.APIServerPeakMiB, cpr.APIServerRSSMiB = mem(api)
	_, cpr.EtcdRSSMiB = mem(etcd)
	cpr.EtcdDBBytes = etcdDBSize(cp.EtcdURL)
	final, _ := apiMetrics(ctx, cs)
	cpr.Objects = map[string]float64{}
	cpr.WatchCacheCapacities = map[string]float64{}
	cpr.ListsFromCache = map[string]float64{}
	cpr.ListsFromEtcd = map[string]float64{}
	cpr.ConsistentFromCache = map[string]float64{}
	for _, res := range []string{"nodes", "pods", "daemonsets"} {
		cpr.Objects[res] = final.objects[res]
		cpr.WatchCacheCapacities[res] = final.watchCache[res]
		cpr.ListsFromCache[res] = after.cacheLists[res] - before.cacheLists[res]
		cpr.ListsFromEtcd[res] = after.etcdLists[res] - before.etcdLists[res]
		cpr.ConsistentFromCache[res] = after.consistentFromCache[res] - before.consistentFromCache[res]
	}
	return r, nil
}

// logLevels counts error and warning lines in a serve log (--log-format=json).
func logLevels(path string) (errs, warns int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1, -1
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		l := bytes.ToUpper(line)
		switch {
		case bytes.Contains(l, []byte(`"LEVEL":"ERROR"`)):
			errs++
		case bytes.Contains(l, []byte(`"LEVEL":"WARN`)):
			warns++
		}
	}
	return errs, warns
}

// apiServerMetrics is what the benchmark reads from the API server's
// /metrics, by resource.
type apiServerMetrics struct {
	objects, cacheLists, etcdLists, watchCache, consistentFromCache map[string]float64
}

func resourceOf(s framework.Sample) string {
	for _, k := range []string{"resource", "resource_prefix", "type"} {
		v := s.Labels[k]
		for _, r := range []string{"daemonsets", "nodes", "pods"} {
			if v == r || strings.HasSuffix(v, "/"+r) || strings.HasPrefix(v, r+".") {
				return r
			}
		}
	}
	return ""
}

func apiMetrics(ctx context.Context, cs *kubernetes.Clientset) (apiServerMetrics, error) {
	m := apiServerMetrics{map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").SetHeader("Accept", "text/plain").DoRaw(ctx)
	if err != nil {
		return m, err
	}
	for _, s := range parseSome(string(raw), "apiserver_resource_objects", "apiserver_storage_objects",
		"apiserver_cache_list_total", "etcd_request_duration_seconds_count", "watch_cache_capacity",
		"apiserver_watch_cache_capacity", "apiserver_watch_cache_consistent_read_total") {
		res := resourceOf(s)
		if res == "" {
			continue
		}
		switch s.Name {
		case "apiserver_resource_objects", "apiserver_storage_objects":
			m.objects[res] = s.Value
		case "apiserver_cache_list_total":
			m.cacheLists[res] += s.Value
		case "etcd_request_duration_seconds_count":
			// listWithCount is a LIST read from etcd (listOnlyKeys, the
			// object counter's, is not).
			if op := s.Labels["operation"]; op == "listWithCount" || op == "list" {
				m.etcdLists[res] += s.Value
			}
		case "watch_cache_capacity", "apiserver_watch_cache_capacity":
			m.watchCache[res] = s.Value
		case "apiserver_watch_cache_consistent_read_total":
			if s.Labels["success"] == "true" && s.Labels["fallback"] == "false" {
				m.consistentFromCache[res] += s.Value
			}
		}
	}
	return m, nil
}

func etcdDBSize(url string) float64 {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, s := range parseSome(string(body), "etcd_mvcc_db_total_size_in_bytes") {
		if s.Name == "etcd_mvcc_db_total_size_in_bytes" {
			return s.Value
		}
	}
	return 0
}

func execOutput(bin string, args ...string) (string, error) {
	out, err := exec.Command(bin, args...).Output()
	return string(out), err
}

// parseSome parses the samples of the named metrics only, skipping lines
// framework.ParseMetrics cannot read (label values with commas).
func parseSome(text string, names ...string) []framework.Sample {
	var out []framework.Sample
	for _, line := range strings.Split(text, "\n") {
		for _, n := range names {
			if strings.HasPrefix(line, n+"{") || strings.HasPrefix(line, n+" ") {
				if s, err := framework.ParseMetrics(line); err == nil {
					out = append(out, s...)
				}
				break
			}
		}
	}
	return out
}

// crFlood creates o.crFlood NVIDIADrivers and o.crFlood/6 extra
// ClusterPolicies, each carrying o.crBytes of a field no decision reads (the
// stand-in CRDs keep unknown fields), waits for the replicas to go quiet and
// records their memory; then deletes them all and records it again.
func crFlood(cp *framework.ControlPlane, o options, n int, pids []int, rs []replicaResult) error {
	blob := strings.Repeat("x", o.crBytes)
	policies := o.crFlood / 6
	logf("N=%d: custom-resource flood: %d NVIDIADrivers and %d ClusterPolicies of %d bytes each", n, o.crFlood, policies, o.crBytes)
	create := func(kind, apiVersion, name, spec string) error {
		manifest := fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"metadata":{"name":%q},"spec":%s}`, apiVersion, kind, name, spec)
		if _, stderr, code := cp.KubectlWithInput(manifest, "create", "-f", "-"); code != 0 {
			return fmt.Errorf("kubectl create %s %s: %s", kind, name, stderr)
		}
		return nil
	}
	for i := 0; i < o.crFlood; i++ {
		spec := fmt.Sprintf(`{"driverType":"gpu","nodeSelector":{"bench.gpu-deploy-guard.io/pool":"p%d"},"licensingConfig":{"blob":%q}}`, i, blob)
		if err := create("NVIDIADriver", "nvidia.com/v1alpha1", fmt.Sprintf("bench-flood-%d", i), spec); err != nil {
			return err
		}
	}
	for i := 0; i < policies; i++ {
		spec := fmt.Sprintf(`{"toolkit":{"enabled":true,"env":[{"name":"BLOB","value":%q}]}}`, blob)
		if err := create("ClusterPolicy", "nvidia.com/v1", fmt.Sprintf("bench-flood-%d", i), spec); err != nil {
			return err
		}
	}
	if _, _, err := waitQuiet(pids, o.settleMin, o.settleMax, 0.02); err != nil {
		return err
	}
	for i, pid := range pids {
		rs[i].PeakFloodMiB, rs[i].RSSFloodMiB = mem(pid)
	}
	logf("N=%d: after the flood: RSS %v", n, floodRSS(rs, func(r replicaResult) float64 { return r.RSSFloodMiB }))
	for _, kind := range []string{"nvidiadrivers", "clusterpolicies"} {
		var names []string
		out, _, _ := cp.Kubectl("get", kind, "-o", "name")
		for _, name := range strings.Fields(out) {
			if strings.Contains(name, "/bench-flood-") {
				names = append(names, name)
			}
		}
		if len(names) == 0 {
			continue
		}
		if _, stderr, code := cp.Kubectl(append([]string{"delete", "--wait=true"}, names...)...); code != 0 {
			return fmt.Errorf("kubectl delete %s: %s", kind, stderr)
		}
	}
	if _, _, err := waitQuiet(pids, o.settleMin, o.settleMax, 0.02); err != nil {
		return err
	}
	for i, pid := range pids {
		_, rs[i].RSSFloodGoneMiB = mem(pid)
	}
	logf("N=%d: after deleting them: RSS %v", n, floodRSS(rs, func(r replicaResult) float64 { return r.RSSFloodGoneMiB }))
	return nil
}

func floodRSS(rs []replicaResult, f func(replicaResult) float64) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s %.1f MiB", r.Name, f(r)))
	}
	return out
}
