package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
var clockTicks = func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}()

// memKiB reads VmHWM and VmRSS (KiB) from /proc/<pid>/status.
func memKiB(pid int) (hwm, rss int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmHWM":
			hwm = n
		case "VmRSS":
			rss = n
		}
	}
	return hwm, rss, nil
}

// cpuSeconds is utime+stime of pid (all its threads) from /proc/<pid>/stat.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return (ut + st) / clockTicks, nil
}

// cpuWindow measures the cores each pid used while run runs (or, with run
// nil, over d).
func cpuWindow(pids []int, d time.Duration, run func()) ([]float64, time.Duration, error) {
	before := make([]float64, len(pids))
	for i, pid := range pids {
		c, err := cpuSeconds(pid)
		if err != nil {
			return nil, 0, err
		}
		before[i] = c
	}
	t0 := time.Now()
	if run != nil {
		run()
	} else {
		time.Sleep(d)
	}
	wall := time.Since(t0)
	cores := make([]float64, len(pids))
	for i, pid := range pids {
		c, err := cpuSeconds(pid)
		if err != nil {
			return nil, 0, err
		}
		cores[i] = (c - before[i]) / wall.Seconds()
	}
	return cores, wall, nil
}

// waitQuiet returns once every pid used at most maxCores over a 2 s
// window, but not before min nor after max; it reports how long it waited
// and whether the processes did go quiet.
func waitQuiet(pids []int, min, max time.Duration, maxCores float64) (time.Duration, bool, error) {
	t0 := time.Now()
	for {
		cores, _, err := cpuWindow(pids, 2*time.Second, nil)
		if err != nil {
			return time.Since(t0), false, err
		}
		quiet := true
		for _, c := range cores {
			quiet = quiet && c <= maxCores
		}
		el := time.Since(t0)
		if quiet && el >= min {
			return el, true, nil
		}
		if el >= max {
			return el, false, nil
		}
	}
}

// heartbeatStats is what the heartbeat load did.
type heartbeatStats struct {
	Rate    float64 `json:"rate"` // asked for, per second
	Sent    int64   `json:"sent"` // patches answered 200
	Failed  int64   `json:"failed"`
	Seconds float64 `json:"seconds"`
	Late    int64   `json:"late"` // patches started more than a second behind schedule
}

// heartbeats patches nodes/status of the fleet's nodes at rate per second
// for d, the way a kubelet's periodic status report refreshes its
// conditions' lastHeartbeatTime (strategic merge on the conditions' type).
func heartbeats(ctx context.Context, cs *kubernetes.Clientset, nodes int, rate float64, d time.Duration, workers int) heartbeatStats {
	st := heartbeatStats{Rate: rate}
	total := int(rate * d.Seconds())
	if total < 1 || nodes < 1 {
		return st
	}
	type job struct {
		node int
		due  time.Time
	}
	jobs := make(chan job, workers)
	var sent, failed, late atomic.Int64
	var wg sync.WaitGroup
	conds := []string{"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if time.Since(j.due) > time.Second {
					late.Add(1)
				}
				now := time.Now().UTC().Format(time.RFC3339)
				var b strings.Builder
				b.WriteString(`{"status":{"conditions":[`)
				for i, c := range conds {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, `{"type":%q,"lastHeartbeatTime":%q}`, c, now)
				}
				b.WriteString(`]}}`)
				_, err := cs.CoreV1().Nodes().Patch(ctx, nodeName(j.node), types.StrategicMergePatchType,
					[]byte(b.String()), metav1.PatchOptions{FieldManager: "kubelet"}, "status")
				if err != nil {
					failed.Add(1)
				} else {
					sent.Add(1)
				}
			}
		}()
	}
	t0 := time.Now()
	next := rand.Intn(nodes)
	for k := 0; k < total && ctx.Err() == nil; k++ {
		due := t0.Add(time.Duration(float64(k) / rate * float64(time.Second)))
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		jobs <- job{node: next, due: due}
		next = (next + 1) % nodes
	}
	// The window is d whatever the last patch took.
	if w := time.Until(t0.Add(d)); w > 0 {
		time.Sleep(w)
	}
	close(jobs)
	wg.Wait()
	st.Sent, st.Failed, st.Late = sent.Load(), failed.Load(), late.Load()
	st.Seconds = time.Since(t0).Seconds()
	return st
}

// auditRun is one `gpu-deploy-guard audit` of the cluster.
type auditRun struct {
	Seconds   float64 `json:"seconds"`
	MaxRSSKiB int64   `json:"max_rss_kib"` // wait4's ru_maxrss
	ExitCode  int     `json:"exit_code"`
	Lines     int     `json:"stdout_lines"`
	Stderr    string  `json:"stderr"`
}

func runAudit(bin, kubeconfig, config string, timeout time.Duration) (auditRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "audit", "--config", config)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	err := cmd.Run()
	r := auditRun{Seconds: time.Since(t0).Seconds(), Lines: bytes.Count(stdout.Bytes(), []byte("\n"))}
	if ee, ok := err.(*exec.ExitError); ok {
		r.ExitCode = ee.ExitCode()
	} else if err != nil {
		return r, err
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.MaxRSSKiB = ru.Maxrss // KiB on Linux
	}
	r.Stderr = strings.TrimSpace(stderr.String())
	if len(r.Stderr) > 2000 {
		r.Stderr = r.Stderr[:2000] + "…"
	}
	return r, nil
}
