package framework

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// OperatorBuild is one version of the real NVIDIA GPU Operator, built by
// build-operator.sh into the cache (see that script for the layout).
type OperatorBuild struct {
	Version string // the operator's release tag, e.g. v25.3.4
	Dir     string // cache entry: root/, crds/, clusterpolicy.yaml
}

// Root is the directory the operator runs chrooted in.
func (b OperatorBuild) Root() string { return filepath.Join(b.Dir, "root") }

// CRDDir holds the operator's own CRDs (deployments/gpu-operator/crds/).
func (b OperatorBuild) CRDDir() string { return filepath.Join(b.Dir, "crds") }

// SampleClusterPolicy is config/samples/v1_clusterpolicy.yaml of the module.
func (b OperatorBuild) SampleClusterPolicy() string {
	return filepath.Join(b.Dir, "clusterpolicy.yaml")
}

// BuildOperator runs build-operator.sh (a no-op once the version is cached)
// and returns where the build is. $GDG_OPERATOR_VERSION picks the version.
func BuildOperator() (OperatorBuild, error) {
	script, err := findScript("build-operator.sh")
	if err != nil {
		return OperatorBuild{}, err
	}
	cmd := exec.Command("bash", script)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return OperatorBuild{}, fmt.Errorf("%s failed: %w", script, err)
	}
	var b OperatorBuild
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "GDG_OPERATOR_DIR":
			b.Dir = v
		case "GDG_OPERATOR_VERSION":
			b.Version = v
		}
	}
	if b.Dir == "" || b.Version == "" {
		return OperatorBuild{}, fmt.Errorf("%s printed no GDG_OPERATOR_DIR/GDG_OPERATOR_VERSION: %q", script, out)
	}
	return b, nil
}

// findScript locates tests/e2e/<name>: next to this package's source when the
// path is known, else upwards from the working directory (go test runs in the
// package directory).
func findScript(name string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		p := filepath.Join(filepath.Dir(file), "..", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		for _, p := range []string{filepath.Join(dir, name), filepath.Join(dir, "tests", "e2e", name)} {
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find " + name)
		}
		dir = parent
	}
}

// Operator is the real GPU Operator's controller manager, running out of
// cluster against the control plane.
type Operator struct {
	Build   OperatorBuild
	Root    string // this run's chroot (a copy of the build's root plus its kubeconfig)
	LogPath string
	proc    *process
}

// StartOperator runs the operator with the given kubeconfig (typically a
// service account token of namespace gpu-operator, so that the webhook sees
// the operator's real identity) and OPERATOR_NAMESPACE=namespace.
//
// The operator reads its assets from the hard-coded /opt/gpu-operator and,
// in v25.x, /host-etc/os-release. It runs chrooted in a per-run copy of the
// build's small root that holds exactly those files, its binary and the
// kubeconfig, so nothing on the host is written. Chroot needs root; as
// another user it runs in a new user namespace that maps that user to root.
func (cp *ControlPlane) StartOperator(b OperatorBuild, kubeconfig, namespace string) (*Operator, error) {
	root, err := os.MkdirTemp(cp.Dir, "gpu-operator-root-")
	if err != nil {
		return nil, err
	}
	if err := copyTree(b.Root(), root); err != nil {
		return nil, fmt.Errorf("copying the operator's root: %w", err)
	}
	kc, err := os.ReadFile(kubeconfig)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "kubeconfig"), kc, 0o600); err != nil {
		return nil, err
	}
	name := "gpu-operator-" + b.Version
	logPath := filepath.Join(cp.LogDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := []string{"--metrics-bind-address=0", "--health-probe-bind-address=0"}
	fmt.Fprintf(logFile, "+ chroot %s /bin/gpu-operator %q\n", root, args)
	cmd := exec.Command("/bin/gpu-operator", args...)
	cmd.Dir = "/"
	cmd.Env = []string{
		"OPERATOR_NAMESPACE=" + namespace,
		"KUBECONFIG=/kubeconfig",
		"HOME=/tmp",
		"USER=gpu-operator",
	}
	// Operand images: nothing is pulled (no kubelet runs the pods), but the
	// operator renders no DaemonSet without an image, and the sample
	// ClusterPolicy names none: the operator image sets these variables.
	for _, v := range operandImageVars {
		cmd.Env = append(cmd.Env, v+"=registry.invalid/gpu-operator-oracle/"+strings.ToLower(strings.TrimSuffix(v, "_IMAGE"))+":v0")
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Chroot: root}
	if uid, gid := os.Geteuid(), os.Getegid(); uid != 0 {
		attr.Cloneflags = syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}}
	}
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start the GPU Operator chrooted in %s: %w", root, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return &Operator{Build: b, Root: root, LogPath: logPath, proc: p}, nil
}

// operandImageVars are the image variables the operator reads (the
// ImagePath calls of controllers/ and internal/, v25.3.4).
var operandImageVars = []string{
	"CC_MANAGER_IMAGE", "CONTAINER_TOOLKIT_IMAGE", "CUDA_BASE_IMAGE", "DCGM_EXPORTER_IMAGE",
	"DCGM_IMAGE", "DEVICE_PLUGIN_IMAGE", "DRIVER_IMAGE", "DRIVER_MANAGER_IMAGE", "GDRCOPY_IMAGE",
	"GDS_IMAGE", "GFD_IMAGE", "KATA_MANAGER_IMAGE", "MIG_MANAGER_IMAGE",
	"SANDBOX_DEVICE_PLUGIN_IMAGE", "VALIDATOR_IMAGE", "VFIO_MANAGER_IMAGE",
	"VGPU_DEVICE_MANAGER_IMAGE", "VGPU_MANAGER_IMAGE",
}

// Running reports whether the operator process is still alive.
func (o *Operator) Running() bool {
	gone, _ := o.proc.exited()
	return !gone
}

// Stop ends the operator (SIGTERM, then SIGKILL after 5 s).
func (o *Operator) Stop() { o.proc.stop(5 * time.Second) }

// Log returns the operator's log so far.
func (o *Operator) Log() string {
	data, err := os.ReadFile(o.LogPath)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

// copyTree copies the regular files and directories under src to dst.
func copyTree(src, dst string) error {
	return filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, info.Mode().Perm()|0o700)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
