package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// KubectlTimeout bounds a single kubectl invocation.
var KubectlTimeout = 2 * time.Minute

// Kubectl runs the real kubectl against the control plane as the admin user
// (system:masters). exitCode is kubectl's exit status, or -1 if it could not
// be run or was killed after KubectlTimeout (stderr then says why).
func (cp *ControlPlane) Kubectl(args ...string) (stdout, stderr string, exitCode int) {
	return cp.KubectlWithInput("", args...)
}

// KubectlWithInput is Kubectl with stdin, e.g. for `apply -f -`.
func (cp *ControlPlane) KubectlWithInput(stdin string, args ...string) (stdout, stderr string, exitCode int) {
	return cp.KubectlAs(cp.KubeconfigPath, stdin, args...)
}

// KubectlAs runs kubectl with another kubeconfig (e.g. a restricted user).
func (cp *ControlPlane) KubectlAs(kubeconfig, stdin string, args ...string) (stdout, stderr string, exitCode int) {
	ctx, cancel := context.WithTimeout(context.Background(), KubectlTimeout)
	defer cancel()
	full := append([]string{
		"--kubeconfig=" + kubeconfig,
		// Own discovery cache: nothing from $HOME leaks in, nothing stale
		// from an earlier control plane on another port is reused.
		"--cache-dir=" + filepath.Join(cp.Dir, "kubectl-cache"),
	}, args...)
	cmd := exec.CommandContext(ctx, cp.KubectlPath, full...)
	cmd.Env = append(cmd.Environ(), "KUBECONFIG=") // --kubeconfig is the only source
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case ctx.Err() != nil:
		return out.String(), errb.String() + fmt.Sprintf("\nkubectl killed after %s", KubectlTimeout), -1
	case errors.As(err, &exitErr):
		return out.String(), errb.String(), exitErr.ExitCode()
	default:
		return out.String(), errb.String() + "\n" + err.Error(), -1
	}
}

// MustKubectl runs kubectl and fails the test unless it exits 0. It returns
// stdout.
func (cp *ControlPlane) MustKubectl(t testing.TB, args ...string) string {
	t.Helper()
	stdout, stderr, code := cp.Kubectl(args...)
	if code != 0 {
		t.Fatalf("kubectl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// WaitForKubectlOutput polls `kubectl args...` until its trimmed stdout
// equals want, failing the test after timeout with the last output seen.
// Typical use: a jsonpath query on an object's status.
func (cp *ControlPlane) WaitForKubectlOutput(t testing.TB, timeout time.Duration, want string, args ...string) {
	t.Helper()
	WaitFor(t, timeout, fmt.Sprintf("kubectl %s to print %q", strings.Join(args, " "), want), func() (bool, string) {
		stdout, stderr, code := cp.Kubectl(args...)
		got := strings.TrimSpace(stdout)
		if code == 0 && got == want {
			return true, ""
		}
		return false, fmt.Sprintf("exit %d, stdout %q, stderr %q", code, got, strings.TrimSpace(stderr))
	})
}

// WaitCRDsServed waits until each CRD (`clusterpolicies.nvidia.com`) is
// Established (WaitCRDsEstablished) and kubectl can list its objects. The API
// server publishes a new resource in discovery a little after Established,
// and kubectl may hold an older discovery cache, so the first use right after
// the wait can fail with "the server doesn't have a resource type".
func (cp *ControlPlane) WaitCRDsServed(t testing.TB, crds ...string) {
	t.Helper()
	if err := cp.WaitCRDsEstablished(60*time.Second, crds...); err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		WaitFor(t, 30*time.Second, "kubectl to list "+crd, func() (bool, string) {
			_, stderr, code := cp.Kubectl("get", crd, "-A", "-o", "name")
			return code == 0, fmt.Sprintf("exit %d: %s", code, strings.TrimSpace(stderr))
		})
	}
}

// WaitCRDsEstablished polls each CRD until its Established condition is
// True, for at most timeout each. Not `kubectl wait --for=condition`: that
// fails at once (".status.conditions accessor error: <nil> is of the type
// <nil>") when a CRD just created has no conditions yet, which a busy machine
// makes last long enough to be met.
func (cp *ControlPlane) WaitCRDsEstablished(timeout time.Duration, crds ...string) error {
	for _, crd := range crds {
		err := Poll(timeout, func() (bool, string) {
			stdout, stderr, code := cp.Kubectl("get", "crd", crd, "-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
			return code == 0 && stdout == "True", fmt.Sprintf("exit %d, Established %q: %s", code, stdout, strings.TrimSpace(stderr))
		})
		if err != nil {
			return fmt.Errorf("CRD %s not Established: %w", crd, err)
		}
	}
	return nil
}

// ServiceAccountKubeconfig writes a kubeconfig named name that authenticates
// as service account ns/sa with a fresh token, and returns its path once the
// API server takes the token as that account and RBAC has caught up with its
// bindings: `kubectl auth can-i <check>` answers yes for every check (e.g.
// {"watch", "pods", "-n", "gpu-operator"}), one per binding to wait for.
func (cp *ControlPlane) ServiceAccountKubeconfig(t testing.TB, name, ns, sa string, checks ...[]string) string {
	t.Helper()
	token := strings.TrimSpace(cp.MustKubectl(t, "create", "token", sa, "-n", ns, "--duration=2h"))
	kubeconfig, err := cp.WriteTokenKubeconfig(name, token)
	if err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + ns + ":" + sa
	WaitFor(t, 30*time.Second, "the token of "+user+" to carry its RBAC", func() (bool, string) {
		who, stderr, code := cp.KubectlAs(kubeconfig, "", "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
		if code != 0 || who != user {
			return false, fmt.Sprintf("whoami: exit %d %q %q", code, who, stderr)
		}
		for _, check := range checks {
			answer, _, code := cp.KubectlAs(kubeconfig, "", append([]string{"auth", "can-i"}, check...)...)
			if code != 0 {
				return false, "can-i " + strings.Join(check, " ") + ": " + strings.TrimSpace(answer)
			}
		}
		return true, ""
	})
	return kubeconfig
}
