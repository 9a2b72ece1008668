// Package nsutil gives tests throwaway network namespaces: creating and
// deleting them, wiring them with veth pairs, and running listeners and
// dialers inside them from the test process (a socket stays in the
// namespace it was created in, so only its creation needs the namespace).
package nsutil

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// NS is a named network namespace created by a test.
type NS struct {
	Name   string
	handle netns.NsHandle
}

// RequireRoot skips t unless it runs as root with `ip netns` available.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and programs nftables in them")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (Debian package iproute2)")
	}
}

// Unique returns prefix followed by random hex, short enough for interface
// and namespace names.
func Unique(prefix string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// New creates a namespace named prefix+random with loopback up; it is
// deleted when the test ends, pass or fail.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	RequireRoot(t)
	name := Unique(prefix)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	n := &NS{Name: name}
	t.Cleanup(func() { n.Close() })
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	n.handle = h
	n.IP(t, "link", "set", "lo", "up")
	// No duplicate address detection: addresses are usable at once, so
	// that IPv6 tests do not race the 1 s of tentative link-local addresses.
	for _, k := range []string{"net.ipv6.conf.all.accept_dad", "net.ipv6.conf.default.accept_dad"} {
		n.Sysctl(t, k, "0")
	}
	return n
}

// Close deletes the namespace. Sockets created in it keep it alive until
// they are closed.
func (n *NS) Close() {
	if n.handle.IsOpen() {
		_ = n.handle.Close()
	}
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
}

// FD is the namespace's file descriptor, for netlink libraries.
func (n *NS) FD() int { return int(n.handle) }

// IP runs `ip -n NAME args...` and fails the test on error.
func (n *NS) IP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.Exec("ip", args...)
	if err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", n.Name, strings.Join(args, " "), err, out)
	}
	return out
}

// Exec runs a command inside the namespace.
func (n *NS) Exec(cmd string, args ...string) (string, error) {
	c := exec.Command("ip", append([]string{"netns", "exec", n.Name, cmd}, args...)...)
	var buf bytes.Buffer
	c.Stdout, c.Stderr = &buf, &buf
	err := c.Run()
	return buf.String(), err
}

// Sysctl sets a sysctl inside the namespace (key in dotted form).
func (n *NS) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	err := n.Do(func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644)
	})
	if err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v", key, value, n.Name, err)
	}
}

// Do runs fn on an OS thread that has entered the namespace. /proc/sys and
// sockets created by fn belong to the namespace.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is left locked so that the runtime discards it
		// afterwards instead of reusing a thread in a foreign namespace.
		runtime.LockOSThread()
		if err := netns.Set(n.handle); err != nil {
			errc <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Veth connects a and b with a veth pair named aIf (in a) and bIf (in b),
// assigns the given CIDR addresses (none when empty) and brings both up.
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
