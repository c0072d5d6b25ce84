package e2e

import (
	"strings"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// draSlice is a ResourceSlice as NVIDIA's GPU DRA driver (k8s-dra-driver-gpu)
// publishes one per node, or of another driver.
func draSlice(name, driver, node string) string {
	return `apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: ` + name + `
spec:
  driver: ` + driver + `
  nodeName: ` + node + `
  pool:
    name: ` + node + `
    generation: 1
    resourceSliceCount: 1
  devices:
  - name: gpu-0
  - name: gpu-1
`
}

// TestDevicePluginBesideTheDRADriver: NVIDIA's GPU DRA driver publishes a
// ResourceSlice for lab-node-1 (gpu.nvidia.com), another driver one for
// lab-node-0. The watching guard (the shipped RBAC, its watch narrowed by
// spec.driver) registered as the webhook warns when lab-node-1's device
// plugin is started again beside it, and its audit reports
// device-plugin-beside-dra-driver on lab-node-1 only; once the slice is
// deleted, nothing.
func TestDevicePluginBesideTheDRADriver(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() {
		kubectl("delete", "resourceslices", "lab-node-1-gpu", "lab-node-0-domain", "--ignore-not-found")
		resetLab(t)
	})
	installWatchedCRDs(t)
	g := startWatchingGuard(t, "--report")
	register(t, g)

	got := kubectl("label", "node", "lab-node-1", deployPrefix+"device-plugin=false", "--overwrite")
	expectResult(t, "the device plugin off on lab-node-1", got, 0, "node/lab-node-1 labeled\n", "")
	for _, s := range []string{
		draSlice("lab-node-1-gpu", "gpu.nvidia.com", "lab-node-1"),
		draSlice("lab-node-0-domain", "compute-domain.nvidia.com", "lab-node-0"),
	} {
		if got := kubectlWithInput(s, "create", "-f", "-"); got.code != 0 {
			t.Fatalf("kubectl create of a ResourceSlice: %s", got)
		}
	}

	// The webhook reads the slice: a server-side dry run of the change warns.
	start := []string{"label", "node", "lab-node-1", deployPrefix + "device-plugin=true", "--overwrite"}
	const warning = "Warning: lab-node-1: device-plugin runs beside the gpu.nvidia.com DRA driver\n"
	framework.WaitFor(t, watchFollow, "the webhook to read the slice", func() (bool, string) {
		got := kubectl(append(start, "--dry-run=server")...)
		return strings.Contains(got.stderr, warning), got.String()
	})
	got = kubectl(start...)
	expectResult(t, "the device plugin started beside the DRA driver", got, 0, "node/lab-node-1 labeled\n", warning)

	waitDRA := func(what, line string) policyReport {
		t.Helper()
		return waitReportLines(t, what, line, "lab-node-0 device-plugin-beside-dra-driver pass high")
	}
	r := waitDRA("the audit finds the device plugin beside the DRA driver",
		"lab-node-1 device-plugin-beside-dra-driver warn high labels")
	if msg := r.messages["lab-node-1/device-plugin-beside-dra-driver"]; !strings.HasPrefix(msg,
		"node lab-node-1: the NVIDIA device plugin already runs beside NVIDIA's DRA driver, which publishes ResourceSlices of driver gpu.nvidia.com for this node") {
		t.Errorf("the finding's message:\n%s", msg)
	}
	if n := findingsOf(t, g, "device-plugin-beside-dra-driver"); n != 1 {
		t.Errorf("audit_findings{rule=device-plugin-beside-dra-driver} = %v, want 1", n)
	}

	// The DRA driver leaves the node: nothing to report.
	expectResult(t, "kubectl delete resourceslice lab-node-1-gpu", kubectl("delete", "resourceslice", "lab-node-1-gpu"), 0,
		"resourceslice.resource.k8s.io \"lab-node-1-gpu\" deleted\n", "")
	waitDRA("the finding gone with the slice", "lab-node-1 device-plugin-beside-dra-driver pass high")
}
