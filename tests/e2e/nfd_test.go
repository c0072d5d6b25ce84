package e2e

import (
	"testing"
)

// nfdMasterSA writes NFD's labels.
const nfdMasterSA = "system:serviceaccount:node-feature-discovery:nfd-master"

// TestNFDLabelsLostAreReported: NFD stops labelling lab-node-1's NVIDIA PCI
// device (a change of its configuration, gpu-operator#1469). The watching
// guard's audit must report nfd-labels-lost on it at once, saying that the
// operator's next pass removes every operand; once the operator has done so
// (gpu.present=false, the deploy labels gone) the finding stays and says it
// happened; NFD's label back, the finding goes.
func TestNFDLabelsLostAreReported(t *testing.T) {
	setUpLab(t)
	t.Cleanup(func() { resetLab(t) })
	installWatchedCRDs(t)
	grantNodeLabels(t, "e2e-nfd-master-nodes", nfdMasterSA)
	g := startWatchingGuard(t, "--report")
	const pci = nfdNvidiaPCI

	wait := func(what, line, prefix string) {
		t.Helper()
		waitFinding(t, what, line, "lab-node-1/nfd-labels-lost", prefix)
	}
	wait("the audit of the lab", "lab-node-1 nfd-labels-lost pass medium", "")

	got := kubectl("--as="+nfdMasterSA, "label", "node", "lab-node-1", pci+"-")
	expectResult(t, "NFD drops the NVIDIA PCI label", got, 0, "node/lab-node-1 unlabeled\n", "")
	wait("nfd-labels-lost, before the operator's pass", "lab-node-1 nfd-labels-lost warn medium labels",
		"node lab-node-1: NFD labels no NVIDIA PCI device on it any more (none of "+pci)
	if n := findingsOf(t, g, "nfd-labels-lost"); n != 1 {
		t.Errorf("audit_findings{rule=nfd-labels-lost} = %v, want 1", n)
	}

	// The operator's pass: gpu.present flips, every deploy label goes.
	pass := []string{"label", "node", "lab-node-1", "nvidia.com/gpu.present=false", "--overwrite"}
	for _, op := range labOperands {
		pass = append(pass, deployPrefix+op+"-")
	}
	if got := kubectlAsOperator(pass...); got.code != 0 {
		t.Fatalf("the operator's labelling pass: %s", got)
	}
	wait("nfd-labels-lost, after the operator's pass", "lab-node-1 nfd-labels-lost warn medium labels",
		"node lab-node-1: nvidia.com/gpu.present=false and no NFD NVIDIA PCI label (")

	// NFD's label comes back: nothing is lost any more (the operator then
	// labels the node again).
	got = kubectl("--as="+nfdMasterSA, "label", "node", "lab-node-1", pci+"=true")
	expectResult(t, "NFD labels the device again", got, 0, "node/lab-node-1 labeled\n", "")
	wait("nfd-labels-lost gone", "lab-node-1 nfd-labels-lost pass medium", "")
}
