package e2e

import (
	"strings"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// TestHelmCELPolicyWithClusterPolicyParamHonoursToolkitEnabled: the chart's
// CEL fallback with celPolicy.clusterPolicyParam=true reads the GPU
// Operator's ClusterPolicy as its parameter. With no ClusterPolicy the
// operator deploys nothing and the policy allows the lab's bad change; with
// spec.toolkit.enabled=true it refuses it; with false (toolkit installed on
// the hosts) it allows the device plugin alone, as the webhook does. No
// webhook is registered meanwhile, so every answer is the policy's.
func TestHelmCELPolicyWithClusterPolicyParamHonoursToolkitEnabled(t *testing.T) {
	helmTools(t)
	resetLab(t)
	installWatchedCRDs(t)
	cp.MustKubectl(t, "delete", "validatingwebhookconfiguration", framework.WebhookConfigurationName, "--ignore-not-found")
	t.Cleanup(func() {
		if got := kubectl("delete", "clusterpolicy.nvidia.com", clusterPolicyName, "--ignore-not-found"); got.code != 0 {
			t.Errorf("cleanup: %s", got)
		}
	})

	got := runHelm(t, "template", helmRelease, helmChartDir, "--namespace", helmNamespace, "--kube-version", helmKubeVersion,
		"--set", "celPolicy.enabled=true", "--set", "celPolicy.clusterPolicyParam=true",
		"--show-only", "templates/celpolicy.yaml")
	if got.code != 0 {
		t.Fatalf("helm template: %s", got)
	}
	manifest := got.stdout
	t.Cleanup(func() {
		if stdout, stderr, code := cp.KubectlWithInput(manifest, "delete", "-f", "-", "--ignore-not-found"); code != 0 {
			t.Errorf("cleanup: kubectl delete of the CEL policy: %s%s", stdout, stderr)
		}
	})
	if stdout, stderr, code := cp.KubectlWithInput(manifest, "apply", "-f", "-"); code != 0 {
		t.Fatalf("kubectl apply of the CEL policy: exit %d\n%s%s", code, stdout, stderr)
	}
	expectGet(t, "nvidia.com/v1 ClusterPolicy", `{.spec.paramKind.apiVersion} {.spec.paramKind.kind}`,
		"validatingadmissionpolicy", "gpu-deploy-guard-device-plugin-needs-toolkit")

	allowed := result{"node/lab-node-2 labeled (server dry run)\n", "", 0}
	refused := func(got result) (bool, string) {
		return got.code == 1 && got.stdout == "" &&
				strings.HasPrefix(got.stderr, `Error from server (Forbidden): nodes "lab-node-2" is forbidden: ValidatingAdmissionPolicy 'gpu-deploy-guard-device-plugin-needs-toolkit'`) &&
				strings.Contains(got.stderr, "denied request: node lab-node-2: nvidia.com/gpu.deploy.device-plugin=true would run the NVIDIA device plugin without the container toolkit"),
			got.String()
	}

	// No ClusterPolicy: parameterNotFoundAction Allow. Waited for, so that
	// the policy is known to be loaded, the toolkit=true step comes first.
	applyClusterPolicy(t, `{"toolkit":{"enabled":true}}`)
	framework.WaitFor(t, 30*time.Second, "toolkit.enabled=true: the CEL policy refuses device-plugin=true on lab-node-2", func() (bool, string) {
		return refused(dryRunLabNode2())
	})
	// The hosts bring the toolkit, and the request says so: the policy webhook lets it through.
	if got := tryClusterPolicy(`{"toolkit":{"enabled":false}}`, `{"gpu-deploy-guard.nvidia.com/toolkit-on-hosts":"the lab's hosts"}`); got.code != 0 {
		t.Fatalf("kubectl apply ClusterPolicy toolkit.enabled=false with toolkit-on-hosts: %s", got)
	}
	waitKubectl(t, "toolkit.enabled=false: kubectl label node lab-node-2 device-plugin=true --dry-run=server", allowed, dryRunLabNode2)
	applyClusterPolicy(t, `{"toolkit":{"enabled":true}}`)
	framework.WaitFor(t, 30*time.Second, "toolkit.enabled=true again: refused", func() (bool, string) {
		return refused(dryRunLabNode2())
	})
	cp.MustKubectl(t, "delete", "clusterpolicy.nvidia.com", clusterPolicyName)
	waitKubectl(t, "no ClusterPolicy: kubectl label node lab-node-2 device-plugin=true --dry-run=server", allowed, dryRunLabNode2)
}
