package e2e

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gpu-deploy-guard/tests/e2e/framework"
)

// TestPlaygroundCommandsAnswerAsPrinted: the playground a newcomer starts with
// `make playground` (built and run here as the Makefile does, in a directory
// of the test's own, with its own control plane) prints a "Try it" text; each
// command in it, run as printed with the printed KUBECONFIG, answers as the
// comment above it says: "refused" ones exit 1 with the webhook's refusal,
// the others exit 0. The ClusterPolicy refusal names lab-node-0 and
// lab-node-1, which only a webhook that watches the playground's cluster can
// know, and `audit` reads the cluster.
func TestPlaygroundCommandsAnswerAsPrinted(t *testing.T) {
	bin := framework.RequireProductBinary(t)
	root := repoRoot(t)
	dir := t.TempDir()
	playground := filepath.Join(dir, "playground")
	build := exec.Command("go", "build", "-o", playground, "./cmd/playground")
	build.Dir = filepath.Join(root, "tests", "e2e")
	build.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/playground: %v\n%s", err, out)
	}
	cmd := exec.Command(playground, "-dir", filepath.Join(dir, "run"), "-bin", bin)
	cmd.Env = append(os.Environ(), "GDG_CACHE="+os.Getenv("GDG_CACHE"))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	// The text up to "Stop:", read as it comes.
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var text []string
	deadline := time.After(3 * time.Minute)
	ready := false
read:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("the playground exited before its instructions were complete:\n%s", strings.Join(text, "\n"))
			}
			if strings.HasPrefix(line, "ready") {
				ready = true
			}
			if ready {
				text = append(text, line)
			}
			if strings.HasPrefix(line, "Stop:") {
				break read
			}
		case <-deadline:
			t.Fatalf("the playground did not print its instructions within 3 minutes:\n%s", strings.Join(text, "\n"))
		}
	}
	go func() {
		for range lines {
		}
	}()
	t.Logf("the playground's instructions:\n%s", strings.Join(text, "\n"))

	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(cp.KubectlPath, filepath.Join(binDir, "kubectl")); err != nil {
		t.Fatal(err)
	}
	var kubeconfig, expect string
	ran := 0
	for _, line := range text {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "export KUBECONFIG="):
			kubeconfig = strings.TrimPrefix(line, "export KUBECONFIG=")
		case strings.HasPrefix(line, "#"):
			expect = line
		case strings.HasPrefix(line, "kubectl ") || strings.HasPrefix(line, bin+" "):
			if kubeconfig == "" {
				t.Fatalf("%q comes before the KUBECONFIG export", line)
			}
			// As printed, with the suite's kubectl first on PATH as `kubectl`.
			run := exec.Command("bash", "-c", line)
			run.Dir = root
			run.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PATH="+binDir+":"+os.Getenv("PATH"))
			out, err := run.CombinedOutput()
			code := 0
			if exit, ok := err.(*exec.ExitError); ok {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			ran++
			refused := strings.HasPrefix(expect, "# refused")
			// audit exits 1 when a node fails: the lab's lab-node-2 may, by then.
			if strings.HasPrefix(line, bin+" audit") && code == 1 {
				code = 0
			}
			switch {
			case refused && (code != 1 || !strings.Contains(string(out), "denied the request")):
				t.Errorf("%s (%s): want refused by the webhook, got exit %d:\n%s", line, expect, code, out)
			case !refused && code != 0:
				t.Errorf("%s (%s): want exit 0, got exit %d:\n%s", line, expect, code, out)
			case strings.Contains(line, "patch clusterpolicy") && !strings.Contains(string(out), "on 2 nodes (lab-node-0, lab-node-1)"):
				t.Errorf("%s: want the refusal to name lab-node-0 and lab-node-1 (the webhook watches the cluster), got:\n%s", line, out)
			case strings.HasPrefix(line, bin+" audit") && !strings.Contains(string(out), "lab-node-0"):
				t.Errorf("%s: want the audit of the playground's nodes, got:\n%s", line, out)
			default:
				t.Logf("%s: exit %d, as %q says", line, code, expect)
			}
		}
	}
	if ran < 10 {
		t.Errorf("ran %d of the printed commands, want every one (at least 10)", ran)
	}
}
