package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

const (
	// mig-manager's service account: exempt, like every operator account.
	migManagerSA = "system:serviceaccount:gpu-operator:nvidia-mig-manager"
	// The limits of stuckConfig: short, so that the test waits seconds.
	stuckPause   = 8 * time.Second
	stuckUpgrade = 12 * time.Second
)

// stuckConfig writes the shipped policy with stuckAfter shortened to
// stuckPause and stuckUpgrade, refusing a shipped policy that has no
// stuckAfter to shorten.
func stuckConfig(t *testing.T) string {
	t.Helper()
	shipped, err := os.ReadFile(guard.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(shipped)
	for key, limit := range map[string]time.Duration{"pause": stuckPause, "driverUpgrade": stuckUpgrade} {
		re := regexp.MustCompile(`(?m)^(  ` + key + `:) .*$`)
		if !re.MatchString(text) {
			t.Fatalf("the shipped policy %s has no stuckAfter.%s:\n%s", guard.ConfigFile, key, text)
		}
		text = re.ReplaceAllString(text, "${1} "+limit.String())
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStuckMigPauseAndDriverUpgradeAreReported: mig-manager pauses
// lab-node-1's operands for a MIG change that then fails (gpu-operator#2833:
// the labels stay paused-for-mig-change), and lab-node-0's driver upgrade
// state is a value no upgrade controller writes. The watching guard, whose
// policy allows a pause stuckPause and an upgrade state stuckUpgrade, must
// find neither before its limit, find both after it with no further change
// of the nodes (time alone), name the component, the MIG state and the
// unknown value in the ClusterPolicyReport, and drop the pause once
// mig-manager writes the labels back.
func TestStuckMigPauseAndDriverUpgradeAreReported(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() { resetLab(t) })
	installWatchedCRDs(t)
	grantNodeLabels(t, "e2e-mig-manager-nodes", migManagerSA)
	g := startWatchingReplicaWithConfig(t, watchingRBAC(t), "gpu-deploy-guard-stuck", stuckConfig(t), "--report")

	paused := []string{"label", "node", "lab-node-1", "--overwrite",
		deployPrefix + "device-plugin=paused-for-mig-change",
		deployPrefix + "gpu-feature-discovery=paused-for-mig-change",
		deployPrefix + "dcgm-exporter=paused-for-mig-change",
		"nvidia.com/mig.config.state=pending"}
	got := kubectl(append([]string{"--as=" + migManagerSA}, paused...)...)
	expectResult(t, "mig-manager pauses lab-node-1", got, 0, "node/lab-node-1 labeled\n", "")
	got = kubectl("--as="+migManagerSA, "label", "node", "lab-node-1", "--overwrite", "nvidia.com/mig.config.state=failed")
	expectResult(t, "the MIG change fails", got, 0, "node/lab-node-1 labeled\n", "")
	got = kubectlAsOperator("label", "node", "lab-node-0", "--overwrite", "nvidia.com/gpu-driver-upgrade-state=upgrade-stalled")
	expectResult(t, "an unknown upgrade state on lab-node-0", got, 0, "node/lab-node-0 labeled\n", "")
	labelled := time.Now()

	// Before the limit: the audit has the nodes (their pause counted as
	// running again) and finds nothing stuck.
	framework.WaitFor(t, watchFollow, "the audit of the paused node", func() (bool, string) {
		r, err := readPolicyReport()
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(r.text, "lab-node-1 pause-stuck pass medium"), r.text
	})
	if elapsed := time.Since(labelled); elapsed < stuckPause-2*time.Second {
		if n := findingsOf(t, g, "pause-stuck"); n != 0 {
			t.Fatalf("pause-stuck found on %v nodes %s after the pause, before its limit of %s", n, elapsed, stuckPause)
		}
	}

	// After it, with no change of either node.
	want := map[string]string{
		"lab-node-1 pause-stuck warn medium history": "node lab-node-1: mig-manager has held nvidia.com/gpu.deploy.dcgm-exporter, " +
			"nvidia.com/gpu.deploy.device-plugin, nvidia.com/gpu.deploy.gpu-feature-discovery at paused-for-mig-change since ",
		"lab-node-0 driver-upgrade-stuck warn medium history": "node lab-node-0 has been in driver upgrade state upgrade-stalled " +
			"(nvidia.com/gpu-driver-upgrade-state) since ",
	}
	var report policyReport
	framework.WaitFor(t, stuckUpgrade+watchFollow, "both findings", func() (bool, string) {
		r, err := readPolicyReport()
		if err != nil {
			return false, err.Error()
		}
		report = r
		for line, prefix := range want {
			fields := strings.Fields(line)
			if !strings.Contains(r.text, line) || !strings.HasPrefix(r.messages[fields[0]+"/"+fields[1]], prefix) {
				return false, r.text
			}
		}
		return true, ""
	})
	if elapsed := time.Since(labelled); elapsed < stuckUpgrade-time.Second {
		t.Fatalf("driver-upgrade-stuck found %s after the state was written, before its limit of %s", elapsed, stuckUpgrade)
	}
	pause := report.messages["lab-node-1/pause-stuck"]
	for _, says := range []string{
		"longer than stuckAfter.pause (8s); nvidia.com/mig.config.state is failed (since ",
		"until mig-manager writes the labels back when the MIG reconfiguration ends",
		"by this guard's clock, which starts when it first sees the value and again when the guard restarts",
	} {
		if !strings.Contains(pause, says) {
			t.Errorf("the pause-stuck message does not say %q:\n%s", says, pause)
		}
	}
	upgrade := report.messages["lab-node-0/driver-upgrade-stuck"]
	if !strings.Contains(upgrade, `"upgrade-stalled" is no state of the GPU Operator's upgrade controller this guard knows`) {
		t.Errorf("the driver-upgrade-stuck message does not name the unknown state:\n%s", upgrade)
	}
	for rule, n := range map[string]float64{"pause-stuck": 1, "driver-upgrade-stuck": 1} {
		if got := findingsOf(t, g, rule); got != n {
			t.Errorf("audit_findings{rule=%q} = %v, want %v", rule, got, n)
		}
	}

	// The MIG change is fixed: mig-manager writes the labels back.
	got = kubectl("--as="+migManagerSA, "label", "node", "lab-node-1", "--overwrite",
		deployPrefix+"device-plugin=true", deployPrefix+"gpu-feature-discovery=true",
		deployPrefix+"dcgm-exporter=true", "nvidia.com/mig.config.state=success")
	expectResult(t, "mig-manager ends the pause", got, 0, "node/lab-node-1 labeled\n", "")
	framework.WaitFor(t, watchFollow, "pause-stuck gone", func() (bool, string) {
		r, err := readPolicyReport()
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(r.text, "lab-node-1 pause-stuck pass medium") &&
			strings.Contains(r.text, "lab-node-0 driver-upgrade-stuck warn medium history"), r.text
	})
}
