package framework

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// GcloudKubectl is the kubectl preferred when $KUBECTL is unset (one minor
// version behind the API server, which kubectl's skew policy allows).
const GcloudKubectl = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33"

// ResolveBinaries finds the control-plane binaries and kubectl.
//
// With $GDG_K8S_BIN_DIR set (run.sh sets it) that directory is used as is.
// Otherwise build-control-plane.sh is run, which builds once into the cache
// and prints where the binaries are, so a bare `go test ./...` also works.
// kubectl: $KUBECTL, else GcloudKubectl, else <bin dir>/kubectl.
func ResolveBinaries() (binDir, kubectl string, err error) {
	binDir, kubectl = os.Getenv("GDG_K8S_BIN_DIR"), os.Getenv("KUBECTL")
	if binDir == "" {
		script, err := findBuildScript()
		if err != nil {
			return "", "", err
		}
		cmd := exec.Command("bash", script)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return "", "", fmt.Errorf("%s failed: %w", script, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), "=")
			switch k {
			case "GDG_K8S_BIN_DIR":
				binDir = v
			case "KUBECTL":
				kubectl = v
			}
		}
		if binDir == "" {
			return "", "", fmt.Errorf("%s printed no GDG_K8S_BIN_DIR", script)
		}
	}
	if kubectl == "" {
		if isExecutable(GcloudKubectl) {
			kubectl = GcloudKubectl
		} else {
			kubectl = filepath.Join(binDir, "kubectl")
		}
	}
	if !isExecutable(kubectl) {
		return "", "", fmt.Errorf("kubectl %q is not an executable file (set KUBECTL, or run build-control-plane.sh to build one)", kubectl)
	}
	return binDir, kubectl, nil
}

// findBuildScript locates tests/e2e/build-control-plane.sh (see findScript).
func findBuildScript() (string, error) {
	p, err := findScript("build-control-plane.sh")
	if err != nil {
		return "", fmt.Errorf("%w; set GDG_K8S_BIN_DIR", err)
	}
	return p, nil
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// ProductBinary returns $GDG_BIN, the gpu-deploy-guard binary under test,
// or "" when it is unset.
func ProductBinary() string { return os.Getenv("GDG_BIN") }

// RequireProductBinary returns $GDG_BIN and fails the test (it does not
// skip) when it is unset or not executable.
func RequireProductBinary(t testing.TB) string {
	t.Helper()
	p := ProductBinary()
	if p == "" {
		t.Fatal("GDG_BIN is not set: point it at the gpu-deploy-guard binary (tests/e2e/run.sh passes it through)")
	}
	if !isExecutable(p) {
		t.Fatalf("GDG_BIN=%q is not an executable file", p)
	}
	return p
}
