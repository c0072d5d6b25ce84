package framework

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// LogTailLines is how much of each component log is printed on failure.
var LogTailLines = 200

// Main is the body of a test package's TestMain: it starts one control
// plane for the package, stores it in *cp, runs the tests and stops it.
//
//	var cp *framework.ControlPlane
//	func TestMain(m *testing.M) { os.Exit(framework.Main(m, &cp)) }
//
// It never skips: if the binaries cannot be built or the control plane does
// not come up, the package fails with the reason and the component logs.
// When tests fail, the tail of every component log is printed before the
// work dir is removed. $GDG_E2E_WORKDIR, when set, is the parent of the
// work dir (run.sh uses it to clean up after a crashed test binary).
func Main(m *testing.M, cp **ControlPlane) int {
	start := time.Now()
	binDir, kubectl, err := ResolveBinaries()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: e2e control plane binaries unavailable: %v\n", err)
		return 1
	}
	workDir := ""
	if root := os.Getenv("GDG_E2E_WORKDIR"); root != "" {
		if err := os.MkdirAll(root, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			return 1
		}
		if workDir, err = os.MkdirTemp(root, "cp-"); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			return 1
		}
	}
	cleanupDir := func() {
		if workDir != "" && os.Getenv("GDG_E2E_KEEP") != "1" {
			_ = os.RemoveAll(workDir)
		}
	}

	c, err := Start(Config{BinDir: binDir, Kubectl: kubectl, WorkDir: workDir})
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: e2e control plane did not start: %v\n", err)
		c.DumpLogs(os.Stdout, LogTailLines)
		markLogsDumped()
		c.Stop()
		cleanupDir()
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: control plane ready %s after TestMain began (kubeconfig %s, kubectl %s)\n",
		time.Since(start).Round(time.Millisecond), c.KubeconfigPath, kubectl)

	// Ctrl-C / SIGTERM: stop the components and remove the work dir instead
	// of leaving that to Pdeathsig and run.sh.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "e2e: %v: stopping control plane\n", s)
		c.Stop()
		cleanupDir()
		os.Exit(1)
	}()

	*cp = c
	code := m.Run()
	signal.Stop(sigs)
	if code != 0 {
		fmt.Printf("\n=== control-plane logs (%s) ===\n", c.LogDir)
		c.DumpLogs(os.Stdout, LogTailLines)
		markLogsDumped()
	}
	c.Stop()
	cleanupDir()
	return code
}

// markLogsDumped tells run.sh that the logs were already printed.
func markLogsDumped() {
	if root := os.Getenv("GDG_E2E_WORKDIR"); root != "" {
		_ = os.WriteFile(filepath.Join(root, ".logs-dumped"), nil, 0o644)
	}
}
