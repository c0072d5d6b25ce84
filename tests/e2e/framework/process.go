package framework

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one control-plane component running in its own process group,
// with stdout and stderr going to <logDir>/<name>.log.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{} // closed when the process has exited
	waitErr error
	stopped bool
}

// startProcess starts bin with args. The child gets its own process group
// (so stop can signal everything it may have spawned) and is SIGKILLed by
// the kernel if the test binary dies without running its cleanup (a panic in
// a test, a `go test -timeout` abort, SIGKILL): no orphaned etcd or API
// server survives a crashed run.
func startProcess(name, bin string, args []string, logDir string) (*process, error) {
	return startProcessEnv(name, bin, args, nil, logDir)
}

// startProcessEnv is startProcess with extra environment variables
// ("KEY=value", added to the test process's own).
func startProcessEnv(name, bin string, args, env []string, logDir string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logFile, "+ %s %q\n", bin, args)
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(cmd.Environ(), env...)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		if p.waitErr == nil {
			return true, errors.New("exited with status 0")
		}
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs
// the group. Safe to call more than once.
func (p *process) stop(grace time.Duration) {
	if p == nil || p.stopped {
		return
	}
	p.stopped = true
	pgid := p.cmd.Process.Pid // Setpgid: the group id is the child's pid
	select {
	case <-p.done:
		// The leader is gone; make sure nothing it started lingers.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return
	default:
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// kill ends the process group with SIGKILL at once and waits for the exit.
func (p *process) kill() {
	if p == nil || p.stopped {
		return
	}
	p.stopped = true
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// freePort asks the kernel for an unused loopback TCP port. Another process
// could take it before the component binds it; components are restarted
// with fresh ports when they fail to come up (see startWithRetry).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
