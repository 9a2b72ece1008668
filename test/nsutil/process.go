package nsutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a long-lived program started inside a network namespace, with
// its stdout and stderr in a log file.
type Process struct {
	Name string // for messages, e.g. "kube-apiserver"
	Log  string // path of the combined stdout/stderr log

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// Start runs argv inside the named namespace (the caller's when netns is
// empty) in its own process group, killed with SIGKILL should this process
// die first. Output goes to logPath.
func Start(netns, name, logPath string, env []string, argv ...string) (*Process, error) {
	if len(argv) == 0 {
		return nil, errors.New("nsutil.Start: empty argv")
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if netns != "" {
		argv = append([]string{"ip", "netns", "exec", netns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id (ip netns exec execs in place, so it is the program's).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	default:
		return false, nil
	}
}

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs.
func (p *Process) Stop(grace time.Duration) {
	if ok, _ := p.Exited(); ok {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Tail returns the last n bytes of the process log, for error messages.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// WaitExitContext waits for the process to exit or ctx to end.
func (p *Process) WaitExitContext(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Start runs argv as a long-lived process inside the namespace, its output
// in a log file under t.TempDir(). The test's cleanup kills it (the
// namespace's deletion would too) and, when the test failed, logs the tail
// of its output. name labels the process in messages and names the log.
func (n *NS) Start(t testing.TB, name string, env []string, argv ...string) *Process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), strings.NewReplacer("/", "_", " ", "_").Replace(name)+".log")
	p, err := Start(n.Name, name, logPath, env, argv...)
	if err != nil {
		t.Fatalf("in netns %s: %v", n.Name, err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", name, p.Tail(4000))
		}
	})
	return p
}
