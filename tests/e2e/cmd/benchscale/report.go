package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
)

// results is everything one invocation measured (results.json).
type results struct {
	Date             string      `json:"date"`
	Binary           string      `json:"binary"`
	Version          string      `json:"version"`
	SHA256           string      `json:"binary_sha256"`
	Note             string      `json:"note"`
	Machine          string      `json:"machine"`
	Broken           bool        `json:"broken_fleet"`
	TaintEvery       int         `json:"taint_every"`
	Replicas         int         `json:"replicas"`
	Fixture          string      `json:"fixture"`
	FixtureBytes     int         `json:"fixture_bytes"`
	Kubeconfig       string      `json:"kubeconfig"`
	QuietSeconds     float64     `json:"quiet_seconds"`
	HeartbeatSeconds float64     `json:"heartbeat_seconds"`
	HeartbeatPeriod  float64     `json:"heartbeat_period_seconds"`
	LeaderMetric     string      `json:"leader_metric"`
	EtcdQuota        int64       `json:"etcd_quota_bytes"`
	Runs             []runResult `json:"runs"`
}

func machine() string {
	mem := ""
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		if line, _, ok := strings.Cut(string(data), "\n"); ok {
			mem = strings.Join(strings.Fields(line)[1:], " ")
		}
	}
	return fmt.Sprintf("%d CPUs, MemTotal %s, %s/%s", runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH)
}

func (res *results) write(dir string) error {
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	// One row per fleet size and replica; the audit's columns repeat on
	// each row of its fleet size.
	b.WriteString(strings.Join([]string{"nodes", "pods", "replica", "ready_s", "peak_rss_first_sync_mib", "rss_settled_mib",
		"metrics_bytes", "metrics_series", "audit_nodes", "leader", "cpu_rest_cores", "heartbeats_per_s",
		"cpu_heartbeat_cores", "peak_rss_after_heartbeats_mib", "rss_after_heartbeats_mib",
		"audit_cli_s", "audit_cli_peak_rss_mib", "audit_cli_exit"}, "\t") + "\n")
	for _, r := range res.Runs {
		for _, rr := range r.Replicas {
			fmt.Fprintf(&b, "%d\t%d\t%s\t%.2f\t%.1f\t%.1f\t%d\t%d\t%s\t%s\t%.4f\t%.2f\t%.4f\t%.1f\t%.1f\t%.2f\t%.1f\t%d\n",
				r.Nodes, r.Pods, rr.Name, rr.ReadySeconds, rr.PeakSyncMiB, rr.RSSSettledMiB,
				rr.MetricsBytes, rr.MetricsSeries, optional(rr.AuditNodes), optional(rr.Leader), rr.CPURest,
				r.Heartbeats.Rate, rr.CPUHeartbeat, rr.PeakHBMiB, rr.RSSHBMiB,
				r.Audit.Seconds, float64(r.Audit.MaxRSSKiB)/mib, r.Audit.ExitCode)
		}
	}
	return os.WriteFile(filepath.Join(dir, "results.tsv"), []byte(b.String()), 0o644)
}

func optional(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%g", *v)
}

// table is the human-readable report of one fleet size.
func table(res results, r runResult) string {
	var b strings.Builder
	fleetKind := "every operand pod Running"
	if res.Broken {
		fleetKind = "broken: every container toolkit pod Pending"
	}
	if res.TaintEvery > 0 {
		fleetKind += fmt.Sprintf(", every %dth node tainted %s=%s:%s", res.TaintEvery, quarantine.Key, quarantine.Value, quarantine.Effect)
	}
	fmt.Fprintf(&b, "\n== %d nodes, %d operand pods, %s (%s; %s)\n", r.Nodes, r.Pods, fleetKind, res.Version, res.Machine)
	fmt.Fprintf(&b, "fill: +%d nodes, +%d pods in %.0f s; etcd db %.0f MiB, kube-apiserver RSS %.0f MiB (peak %.0f), etcd RSS %.0f MiB\n",
		r.Fill.Nodes, r.Fill.Pods, r.Fill.Seconds, r.ControlPlane.EtcdDBBytes/(1<<20),
		r.ControlPlane.APIServerRSSMiB, r.ControlPlane.APIServerPeakMiB, r.ControlPlane.EtcdRSSMiB)
	fmt.Fprintf(&b, "binary %s (sha256 %.12s); serve as %s\n", res.Binary, res.SHA256, res.Kubeconfig)
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, f func(rr replicaResult) string) {
		fmt.Fprintf(w, "%s\t", label)
		for _, rr := range r.Replicas {
			fmt.Fprintf(w, "%s\t", f(rr))
		}
		fmt.Fprintln(w)
	}
	row("", func(rr replicaResult) string { return rr.Name })
	row("time to ready (s)", func(rr replicaResult) string { return fmt.Sprintf("%.1f", rr.ReadySeconds) })
	row("peak RSS, first sync (MiB)", func(rr replicaResult) string { return fmt.Sprintf("%.1f", rr.PeakSyncMiB) })
	row("RSS after settle (MiB)", func(rr replicaResult) string {
		s := fmt.Sprintf("%.1f", rr.RSSSettledMiB)
		if !rr.Settled {
			s += " (never quiet)"
		}
		return s
	})
	row("/metrics (bytes)", func(rr replicaResult) string { return fmt.Sprint(rr.MetricsBytes) })
	row("/metrics (series)", func(rr replicaResult) string { return fmt.Sprint(rr.MetricsSeries) })
	row("audit_nodes / findings", func(rr replicaResult) string {
		return fmt.Sprintf("%s / %g", optional(rr.AuditNodes), rr.Findings)
	})
	row("auditor ("+res.LeaderMetric+")", func(rr replicaResult) string {
		if rr.Leader == nil {
			return "not exposed"
		}
		return fmt.Sprintf("%g", *rr.Leader)
	})
	row("peak RSS after scrape (MiB)", func(rr replicaResult) string { return fmt.Sprintf("%.1f", rr.PeakScrapeMiB) })
	row(fmt.Sprintf("CPU at rest, %.0f s (cores)", res.QuietSeconds), func(rr replicaResult) string { return fmt.Sprintf("%.4f", rr.CPURest) })
	row(fmt.Sprintf("CPU, %.1f heartbeats/s (cores)", r.Heartbeats.Rate), func(rr replicaResult) string { return fmt.Sprintf("%.4f", rr.CPUHeartbeat) })
	row("peak RSS after heartbeats (MiB)", func(rr replicaResult) string { return fmt.Sprintf("%.1f", rr.PeakHBMiB) })
	row("RSS after heartbeats (MiB)", func(rr replicaResult) string { return fmt.Sprintf("%.1f", rr.RSSHBMiB) })
	row("peak / settled RSS with the custom-resource flood (MiB)", func(rr replicaResult) string {
		return fmt.Sprintf("%.1f / %.1f", rr.PeakFloodMiB, rr.RSSFloodMiB)
	})
	row("RSS once the flood is deleted (MiB)", func(rr replicaResult) string { return fmt.Sprintf("%.1f", rr.RSSFloodGoneMiB) })
	row("node reviews in the flood: p50 / p99 / max (ms)", func(rr replicaResult) string {
		f := rr.FloodReviews
		text := fmt.Sprintf("%.1f / %.1f / %.1f", f.P50Ms, f.P99Ms, f.MaxMs)
		if f.Errors > 0 {
			text += fmt.Sprintf(" (%d failed)", f.Errors)
		}
		return text
	})
	row("log errors / warnings", func(rr replicaResult) string { return fmt.Sprintf("%d / %d", rr.LogErrors, rr.LogWarnings) })
	w.Flush()
	fmt.Fprintf(&b, "heartbeats: %d patched, %d failed, %d late, over %.0f s; kube-apiserver %.3f cores at rest, %.3f under them\n",
		r.Heartbeats.Sent, r.Heartbeats.Failed, r.Heartbeats.Late, r.Heartbeats.Seconds,
		r.ControlPlane.APIServerCPURest, r.ControlPlane.APIServerCPUHB)
	fmt.Fprintf(&b, "audit CLI: %.2f s wall, peak RSS %.1f MiB, exit %d, %d lines\n",
		r.Audit.Seconds, float64(r.Audit.MaxRSSKiB)/mib, r.Audit.ExitCode, r.Audit.Lines)
	if r.Audit.ExitCode != 0 && r.Audit.Stderr != "" {
		fmt.Fprintf(&b, "audit stderr: %s\n", r.Audit.Stderr)
	}
	fmt.Fprintf(&b, "lists while serve started: from the watch cache %v (consistent reads %v), from etcd %v; watch cache capacity %v\n",
		r.ControlPlane.ListsFromCache, r.ControlPlane.ConsistentFromCache, r.ControlPlane.ListsFromEtcd, r.ControlPlane.WatchCacheCapacities)
	fmt.Fprintf(&b, "load average: %s at start, %s after the quiet window, %s after the heartbeats (CPU figures are noisy on a shared machine)\n",
		r.ControlPlane.LoadAverageAtStart, r.ControlPlane.LoadAverageQuietEnd, r.ControlPlane.LoadAverageHBEnd)
	return b.String()
}
