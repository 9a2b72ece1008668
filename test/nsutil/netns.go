package nsutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Create makes a new named network namespace with loopback up.
func Create(ctx context.Context, name string) error {
	if err := IP(ctx, "", "netns", "add", name); err != nil {
		return err
	}
	return IP(ctx, name, "link", "set", "lo", "up")
}

// Delete kills every process still in the namespace and removes it. A
// namespace that does not exist is not an error.
func Delete(ctx context.Context, name string) error {
	if _, err := os.Stat(filepath.Join(Dir, name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	KillAll(ctx, name)
	return IP(ctx, "", "netns", "del", name)
}

// KillAll SIGKILLs every process whose network namespace is name.
func KillAll(ctx context.Context, name string) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", name).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 && pid != os.Getpid() {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	}
}

// IP runs `ip [-n name] args...` and returns its error with its output.
func IP(ctx context.Context, name string, args ...string) error {
	_, err := ipOut(ctx, name, args...)
	return err
}

func ipOut(ctx context.Context, name string, args ...string) (string, error) {
	if name != "" {
		args = append([]string{"-n", name}, args...)
	}
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Command returns a command that runs argv inside the named namespace (the
// caller's when name is empty); the caller starts and waits for it.
func Command(ctx context.Context, name string, argv ...string) *exec.Cmd {
	if name != "" {
		argv = append([]string{"ip", "netns", "exec", name}, argv...)
	}
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// Exec runs a short command inside the namespace and returns its combined
// output.
func Exec(ctx context.Context, name string, argv ...string) (string, error) {
	out, err := Command(ctx, name, argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in netns %s: %s: %v: %s", name, strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Sysctl sets key (dotted form) to value inside the named namespace, e.g.
// Sysctl(n, "net.ipv4.ip_forward", "1").
func Sysctl(name, key, value string) error {
	return Do(name, func() error { return writeSysctl(key, value) })
}

func writeSysctl(key, value string) error {
	p := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	return os.WriteFile(p, []byte(value), 0o644)
}

// Do runs fn on an OS thread switched into the named network namespace.
// Sockets fn creates belong to that namespace for their whole life, also
// after Do returns; /proc/sys/net opened inside fn is the namespace's, and
// so is every process fn starts.
func Do(name string, fn func() error) error {
	f, err := os.Open(filepath.Join(Dir, name))
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer f.Close()
	return doIn(int(f.Fd()), name, fn)
}

// doIn runs fn on a fresh goroutine whose thread is switched into the
// namespace behind fd and back. Should the switch back fail, the thread
// stays locked, so the runtime ends it with the goroutine instead of
// running other code in the wrong namespace.
func doIn(fd int, name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		// fn runs only once the thread is proven to be in the target: code
		// meant for a test namespace must never touch the root one.
		ferr := inTarget(fd, name)
		if ferr == nil {
			ferr = fn()
		}
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("setns back from %s: %w", name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// inTarget checks that the calling thread's network namespace is the one
// behind fd.
func inTarget(fd int, name string) error {
	var want, cur unix.Stat_t
	if err := unix.Fstat(fd, &want); err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), &cur); err != nil {
		return err
	}
	if cur.Dev != want.Dev || cur.Ino != want.Ino {
		return fmt.Errorf("setns %s: the thread is not in the namespace; not running", name)
	}
	return nil
}

// NS is a network namespace created for one test by New.
type NS struct {
	Name string
	f    *os.File
}

// New creates a namespace with loopback up and duplicate address detection
// off; it is deleted, with every process still in it, when the test ends,
// pass or fail. Its name is Prefix, the test binary's pid (for Sweep), the
// given prefix and random hex, e.g. "oh1234-ohn-0a1b2c3d" for "ohn-". New
// skips t when namespaces are unusable here.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	RequireRoot(t)
	ctx := context.Background()
	var name string
	var err error
	for range 3 { // a name already taken is the only failure a retry cures
		name = fmt.Sprintf("%s%d-%s%s", Prefix, os.Getpid(), prefix, randHex(4))
		if err = IP(ctx, "", "netns", "add", name); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	n := &NS{Name: name}
	t.Cleanup(n.Close)
	if n.f, err = os.Open(filepath.Join(Dir, name)); err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	n.IP(t, "link", "set", "lo", "up")
	// No duplicate address detection: addresses are usable at once, so
	// that IPv6 tests do not race the 1 s of tentative link-local addresses.
	for _, k := range []string{"net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"} {
		n.Sysctl(t, k, "0")
	}
	return n
}

// Close kills the processes left in the namespace and deletes it. Sockets
// created in it keep it alive until they are closed.
func (n *NS) Close() {
	if n.f != nil {
		_ = n.f.Close()
		n.f = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = Delete(ctx, n.Name)
}

// FD is the namespace's file descriptor, for netlink libraries.
func (n *NS) FD() int { return int(n.f.Fd()) }

// IP runs `ip -n NAME args...` and fails the test on error.
func (n *NS) IP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := ipOut(context.Background(), n.Name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Exec runs a command inside the namespace and returns its combined output.
func (n *NS) Exec(cmd string, args ...string) (string, error) {
	out, err := Command(context.Background(), n.Name, append([]string{cmd}, args...)...).CombinedOutput()
	return string(out), err
}

// Run runs argv inside the namespace, fails the test on error and returns
// the combined output.
func (n *NS) Run(t testing.TB, argv ...string) string {
	t.Helper()
	out, err := Exec(context.Background(), n.Name, argv...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Command returns a command that runs argv inside the namespace, for
// callers that need its pipes. A process still running when the test ends
// is killed with the namespace.
func (n *NS) Command(argv ...string) *exec.Cmd {
	return Command(context.Background(), n.Name, argv...)
}

// Sysctl sets a sysctl inside the namespace (key in dotted form) and fails
// the test on error.
func (n *NS) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	if err := n.Do(func() error { return writeSysctl(key, value) }); err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v", key, value, n.Name, err)
	}
}

// Do runs fn on an OS thread that has entered the namespace, as the
// package-level Do does.
func (n *NS) Do(fn func() error) error { return doIn(n.FD(), n.Name, fn) }

// Veth connects a and b with a veth pair named aIf (in a) and bIf (in b),
// assigns the given CIDR addresses (none when empty; IPv6 ones without
// duplicate address detection) and brings both ends up.
func Veth(t testing.TB, a *NS, aIf string, aAddrs []string, b *NS, bIf string, bAddrs []string) {
	t.Helper()
	tmp := Unique("vt")
	a.IP(t, "link", "add", aIf, "type", "veth", "peer", "name", tmp, "netns", b.Name)
	b.IP(t, "link", "set", tmp, "name", bIf)
	for _, x := range []struct {
		ns    *NS
		ifc   string
		addrs []string
	}{{a, aIf, aAddrs}, {b, bIf, bAddrs}} {
		for _, ad := range x.addrs {
			args := []string{"addr", "add", ad, "dev", x.ifc}
			if strings.Contains(ad, ":") {
				args = append(args, "nodad")
			}
			x.ns.IP(t, args...)
		}
		x.ns.IP(t, "link", "set", x.ifc, "up")
	}
}
