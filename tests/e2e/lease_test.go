package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// auditorWatch samples audit_leader on every replica, every 100 ms, for as
// long as a test runs, and fails the test if two replicas say 1 in two
// samples in a row. (One sample is not enough to fail: a replica thawed from
// SIGSTOP may answer a scrape in the instant before its runtime has run the
// election task that ends its term; its term has already ended by its own
// clock, so it writes nothing then.) A replica that does not answer within a
// second (frozen, killed) is not counted in that sample: a frozen process
// audits nothing, and what it may have started before is the report fence's
// job.
type auditorWatch struct {
	t        *testing.T
	replicas []*framework.Guard
	client   *http.Client
	stop     chan struct{}
	done     chan struct{}

	mu      sync.Mutex
	leaders []string // the replicas that said 1 in the last sample
	samples int
	doubles int // samples with two auditors
	fails   int // of them, those right after another such sample
}

func watchAuditors(t *testing.T, replicas ...*framework.Guard) *auditorWatch {
	w := &auditorWatch{t: t, replicas: replicas, client: &http.Client{Timeout: time.Second},
		stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	t.Cleanup(w.end)
	return w
}

func (w *auditorWatch) leaderOf(g *framework.Guard) (bool, bool) {
	resp, err := w.client.Get(g.AdminURL() + "/metrics")
	if err != nil {
		return false, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, false
	}
	samples, err := framework.ParseMetrics(string(body))
	if err != nil {
		return false, false
	}
	for _, s := range samples {
		if s.Name == metricPrefix+"audit_leader" {
			return s.Value == 1, true
		}
	}
	return false, false
}

func (w *auditorWatch) run() {
	defer close(w.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		var leaders []string
		for _, g := range w.replicas {
			if leader, answered := w.leaderOf(g); answered && leader {
				leaders = append(leaders, g.Name)
			}
		}
		w.mu.Lock()
		w.samples++
		if len(leaders) > 1 {
			w.doubles++
			if len(w.leaders) > 1 {
				w.fails++
				if w.fails <= 3 {
					w.t.Errorf("two auditors in two samples in a row: %s", strings.Join(leaders, ", "))
				}
			}
		}
		w.leaders = leaders
		w.mu.Unlock()
	}
}

func (w *auditorWatch) end() {
	select {
	case <-w.stop:
		return
	default:
	}
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Logf("audit_leader sampled %d times on %d replicas; %d single samples with two auditors, %d in a row", w.samples, len(w.replicas), w.doubles, w.fails)
}

// current is the replicas that said 1 in the last sample, and that sample's
// number.
func (w *auditorWatch) current() ([]string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.leaders...), w.samples
}

// fresh is the replicas that said 1 in a sample begun after this call: what
// happened just before (a signal, a deletion) is in it.
func (w *auditorWatch) fresh(t *testing.T) []string {
	t.Helper()
	_, from := w.current()
	for {
		leaders, n := w.current()
		if n >= from+2 {
			return leaders
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitOne waits until exactly one replica audits and returns it, and how
// long that took.
func (w *auditorWatch) waitOne(t *testing.T, timeout time.Duration, what string) (*framework.Guard, time.Duration) {
	t.Helper()
	start := time.Now()
	_, from := w.current()
	var holder string
	framework.WaitFor(t, timeout, what+": exactly one replica audits", func() (bool, string) {
		leaders, n := w.current()
		if n < from+2 {
			return false, "no sample begun since the wait began"
		}
		if len(leaders) != 1 {
			return false, fmt.Sprintf("auditors: %v", leaders)
		}
		holder = leaders[0]
		return true, ""
	})
	for _, g := range w.replicas {
		if g.Name == holder {
			return g, time.Since(start)
		}
	}
	t.Fatalf("unknown replica %s", holder)
	return nil, 0
}

// TestAuditLeaseFaults: two replicas as the chart runs them elect one
// auditor with a 6 s Lease, and the election survives what a cluster does to
// it. At every sample at most one replica audits; within a Lease's duration
// of each recovery exactly one does, and the ClusterPolicyReport is the
// current auditor's:
//   - an RBAC gap on the Lease (the RoleBinding deleted for three Lease
//     durations, then restored): the holder stops auditing when it cannot
//     renew, nobody audits during the gap, one replica audits after it;
//   - the holder frozen (SIGSTOP) for five Lease durations while the fleet
//     changes: the other takes over and reports the change; the thawed
//     holder never writes its stale report (the report's resourceVersion
//     stays put) and does not audit;
//   - the holder killed right after a change, while its report write is due:
//     the other takes over and reports the change;
//   - the API server killed and restarted on the same port: one auditor
//     within a Lease's duration of its return, and the report follows a
//     change made after it.
func TestAuditLeaseFaults(t *testing.T) {
	setUpIncidentLab(t)
	installWatchedCRDs(t)
	applyClusterPolicy(t, `{"operator":{"defaultRuntime":"containerd"}}`)
	kubeconfig := watchingRBAC(t)
	const leaseDuration = 6 * time.Second
	// A new holder takes over a Lease's duration after it last saw the old
	// one renew; it tries every sixth of it; then one API round trip and a
	// 100 ms sample. The slack is for a loaded 2-core machine; each figure is
	// logged.
	const takeOver = leaseDuration + 6*time.Second
	args := []string{"--report", "--audit-lease-duration=" + leaseDuration.String()}
	a := startWatchingReplica(t, kubeconfig, "gpu-deploy-guard-replica-a", args...)
	b := startWatchingReplica(t, kubeconfig, "gpu-deploy-guard-replica-b", args...)
	w := watchAuditors(t, a, b)
	other := func(g *framework.Guard) *framework.Guard {
		if g == a {
			return b
		}
		return a
	}

	incident := map[string][]string{
		"lab-node-0": nil,
		"lab-node-1": nil,
		"lab-node-2": {"device-plugin-without-toolkit fail pods", "device-plugin-on-non-gpu-node warn labels"},
	}
	// The fleet changes by the exporter pod on lab-node-1 going Pending and
	// Running again: each state has its own report.
	exporter1 := podOf(t, "nvidia-dcgm-exporter", "lab-node-1").name
	exporterPending := map[string][]string{
		"lab-node-0": nil,
		"lab-node-1": {"operand-not-running fail pods"},
		"lab-node-2": incident["lab-node-2"],
	}

	holder, _ := w.waitOne(t, watchStartTimeout, "start")
	waitReport(t, watchStartTimeout, "written by the first auditor", reportLines(incident), nil)

	t.Run("RBAC gap", func(t *testing.T) {
		const binding = "gpu-deploy-guard-audit-lease"
		cp.MustKubectl(t, "delete", "rolebinding", binding, "-n", guardNS)
		gap := time.Now()
		framework.WaitFor(t, leaseDuration, "the holder stops auditing once it cannot renew", func() (bool, string) {
			leaders := w.fresh(t)
			return len(leaders) == 0, fmt.Sprintf("auditors: %v", leaders)
		})
		t.Logf("no auditor %s after the RoleBinding went", time.Since(gap).Round(100*time.Millisecond))
		time.Sleep(3*leaseDuration - time.Since(gap))
		if leaders := w.fresh(t); len(leaders) != 0 {
			t.Errorf("auditors while the Lease cannot be written: %v, want none", leaders)
		}
		cp.MustKubectl(t, "create", "rolebinding", binding, "-n", guardNS, "--role="+binding,
			"--serviceaccount="+guardNS+":gpu-deploy-guard")
		g, took := w.waitOne(t, takeOver, "after the RoleBinding is back")
		t.Logf("%s audits %s after the RoleBinding is back", g.Name, took.Round(100*time.Millisecond))
		holder = g
		setPodPhase(t, exporter1, "Pending")
		waitReport(t, watchFollow, "the exporter on lab-node-1 Pending, after the gap", reportLines(exporterPending), nil)
		setPodPhase(t, exporter1, "Running")
		waitReport(t, watchFollow, "the exporter on lab-node-1 Running again", reportLines(incident), nil)
	})

	t.Run("holder frozen longer than the Lease", func(t *testing.T) {
		frozen := holder
		if err := frozen.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		thawed := false
		thaw := func() {
			if !thawed {
				thawed = true
				if err := frozen.Signal(syscall.SIGCONT); err != nil {
					t.Error(err)
				}
			}
		}
		defer thaw()
		stopped := time.Now()
		// The change the frozen holder never sees: its last report says
		// Running; the new auditor's says Pending.
		setPodPhase(t, exporter1, "Pending")
		g, took := w.waitOne(t, takeOver, "the holder frozen")
		if g == frozen {
			t.Fatalf("%s audits while frozen", g.Name)
		}
		t.Logf("%s took over %s after %s froze", g.Name, took.Round(100*time.Millisecond), frozen.Name)
		written := waitReport(t, watchFollow, "the new auditor's, the exporter Pending", reportLines(exporterPending), nil)
		time.Sleep(5*leaseDuration - time.Since(stopped))
		thaw()
		// The thawed replica would now write its report of a Running
		// exporter, if anything let it: watch the report for two Lease
		// durations.
		deadline := time.Now().Add(2 * leaseDuration)
		for time.Now().Before(deadline) {
			r, err := readPolicyReport()
			if err != nil {
				t.Fatal(err)
			}
			if r.resourceVersion != written.resourceVersion || r.text != written.text {
				t.Fatalf("the ClusterPolicyReport changed after %s thawed (resourceVersion %s -> %s):\n%s",
					frozen.Name, written.resourceVersion, r.resourceVersion, r.text)
			}
			if leaders := w.fresh(t); len(leaders) != 1 || leaders[0] != g.Name {
				t.Errorf("auditors after the thaw: %v, want only %s", leaders, g.Name)
			}
			time.Sleep(250 * time.Millisecond)
		}
		holder = g
		setPodPhase(t, exporter1, "Running")
		waitReport(t, watchFollow, "the exporter Running again, after the thaw", reportLines(incident), nil)
	})

	t.Run("holder killed as its report is due", func(t *testing.T) {
		killed := holder
		setPodPhase(t, exporter1, "Pending")
		// The debounce is a second: the write is due now.
		time.Sleep(900 * time.Millisecond)
		killed.Kill()
		survivor := other(killed)
		g, took := w.waitOne(t, takeOver, "the holder killed")
		if g != survivor {
			t.Fatalf("%s audits, want %s", g.Name, survivor.Name)
		}
		t.Logf("%s took over %s after %s was killed", g.Name, took.Round(100*time.Millisecond), killed.Name)
		waitReport(t, watchFollow, "the survivor's, the exporter Pending", reportLines(exporterPending), nil)
		if err := killed.Start(); err != nil {
			t.Fatalf("restarting %s: %v", killed.Name, err)
		}
		holder = g
		setPodPhase(t, exporter1, "Running")
		waitReport(t, watchFollow, "the exporter Running again, after the kill", reportLines(incident), nil)
	})

	t.Run("API server restarted", func(t *testing.T) {
		if err := cp.RestartAPIServer(leaseDuration); err != nil {
			t.Fatalf("restarting kube-apiserver: %v", err)
		}
		back := time.Now()
		g, took := w.waitOne(t, takeOver, "after the API server is back")
		t.Logf("%s audits %s after the API server is back", g.Name, took.Round(100*time.Millisecond))
		// Hold steady for a Lease's duration: still exactly one.
		time.Sleep(leaseDuration)
		if leaders := w.fresh(t); len(leaders) != 1 {
			t.Errorf("auditors %s after the API server came back: %v, want one", time.Since(back).Round(time.Second), leaders)
		}
		setPodPhase(t, exporter1, "Pending")
		waitReport(t, watchFollow, "the exporter Pending, after the restart", reportLines(exporterPending), nil)
		setPodPhase(t, exporter1, "Running")
		waitReport(t, watchFollow, "the exporter Running again, after the restart", reportLines(incident), nil)
	})
}
