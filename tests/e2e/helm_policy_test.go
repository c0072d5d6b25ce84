package e2e

import (
	"strings"
	"testing"
)

// helmPolicyChart is a GPU Operator-style chart of the suite's own: a
// ClusterPolicy whose switches are values.
const (
	helmPolicyChart   = "testdata/gpu-operator-chart"
	helmPolicyRelease = "gpu-operator"
)

// TestHelmUpgradeThatSwitchesTheToolkitOffFailsWithTheGuardsMessage: a
// release that carries the ClusterPolicy installs (a first ClusterPolicy
// takes nothing away); `helm upgrade --set toolkit.enabled=false` patches it
// and the policy webhook refuses the patch, so the upgrade fails with the
// guard's message, naming the nodes, and the stored policy keeps the
// toolkit. An upgrade that turns the device plugin off with it succeeds.
func TestHelmUpgradeThatSwitchesTheToolkitOffFailsWithTheGuardsMessage(t *testing.T) {
	setUpPolicyLab(t)
	t.Cleanup(func() {
		if got := runHelm(t, "uninstall", helmPolicyRelease, "--namespace", "default", "--ignore-not-found", "--wait"); got.code != 0 {
			t.Errorf("cleanup: helm uninstall %s: %s", helmPolicyRelease, got)
		}
		if got := kubectl("delete", "clusterpolicy", clusterPolicyName, "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})
	if got := runHelm(t, "install", helmPolicyRelease, helmPolicyChart, "--namespace", "default", "--wait"); got.code != 0 || got.stderr != "" {
		t.Fatalf("helm install %s: want success without warnings, got %s", helmPolicyRelease, got)
	}
	if got := clusterPolicySwitches(t); got != policyAsShipped {
		t.Fatalf("after helm install the ClusterPolicy has %s, want %s", got, policyAsShipped)
	}
	waitFleetKnown(t)

	got := runHelm(t, "upgrade", helmPolicyRelease, helmPolicyChart, "--namespace", "default", "--set", "toolkit.enabled=false")
	want := `Error: UPGRADE FAILED: cannot patch "cluster-policy" with kind ClusterPolicy: ` + policyDenied + toolkitRefusal + "\n"
	expectResult(t, "helm upgrade --set toolkit.enabled=false", got, 1, "", want)
	if got := clusterPolicySwitches(t); got != policyAsShipped {
		t.Errorf("after the failed upgrade the ClusterPolicy has %s, want %s", got, policyAsShipped)
	}

	got = runHelm(t, "upgrade", helmPolicyRelease, helmPolicyChart, "--namespace", "default",
		"--set", "toolkit.enabled=false", "--set", "devicePlugin.enabled=false")
	// Allowed; helm prints the API server's warning about the GPUs no longer advertised.
	if got.code != 0 || !strings.Contains(got.stderr, devicePluginStops) {
		t.Fatalf("helm upgrade --set toolkit.enabled=false --set devicePlugin.enabled=false: want success with the warning %q, got %s", devicePluginStops, got)
	}
	if got := clusterPolicySwitches(t); got != "driver=true toolkit=false devicePlugin=false" {
		t.Errorf("after the upgrade that switches both off the ClusterPolicy has %s", got)
	}
}
