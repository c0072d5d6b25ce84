// Package oracle runs the real NVIDIA GPU Operator (built from its Go
// module by build-operator.sh) against a control plane of its own, with the
// webhook installed as deploy/ ships it, and holds gpu-deploy-guard's model
// of the operator to what the operator really does.
//
// It has its own control plane because the operator creates DaemonSets in
// namespace gpu-operator under the same names as the lab's stand-ins
// (../testdata/gpu-operator-daemonsets.yaml) and relabels every GPU node it
// sees: sharing the lab's cluster would make both suites flaky.
package oracle

import (
	"os"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// cp is the control plane of this package.
var cp *framework.ControlPlane

func TestMain(m *testing.M) { os.Exit(framework.Main(m, &cp)) }
