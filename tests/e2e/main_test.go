// Package e2e runs gpu-deploy-guard against a real local control plane.
// Use tests/e2e/run.sh; a bare `go test ./...` here works too and builds the
// control plane binaries on first use.
package e2e

import (
	"os"
	"testing"

	"gpu-deploy-guard/tests/e2e/framework"
)

// cp is the control plane shared by every test in this package.
var cp *framework.ControlPlane

func TestMain(m *testing.M) { os.Exit(framework.Main(m, &cp)) }
