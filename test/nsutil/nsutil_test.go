package nsutil

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A namespace made by New, its veth, its echo server and its process are
// gone when the test that made them ends; traffic crosses the veth both
// ways with the client's address intact.
func TestNamespaceLifecycle(t *testing.T) {
	RequireRoot(t)
	var names []string
	var pid int
	t.Run("inner", func(t *testing.T) {
		a, b := New(t, "ohta-"), New(t, "ohtb-")
		names = []string{a.Name, b.Name}
		if owner(a.Name) != os.Getpid() {
			t.Fatalf("name %q does not carry this process's pid", a.Name)
		}
		Veth(t, a, "eth0", []string{"192.0.2.1/24", "2001:db8::1/64"}, b, "eth0", []string{"192.0.2.2/24", "2001:db8::2/64"})
		b.Echo(t, "b", ":7")
		for _, tc := range []struct{ network, addr, src string }{
			{"tcp", "192.0.2.2:7", "192.0.2.1"},
			{"udp", "192.0.2.2:7", "192.0.2.1"},
			{"tcp", "[2001:db8::2]:7", "2001:db8::1"},
			{"udp", "[2001:db8::2]:7", "2001:db8::1"},
		} {
			// The first packet of a family waits for neighbour discovery on
			// a link that has just come up; on a loaded machine that can
			// outlast one connect, so a lost first try is tried again.
			var r Reply
			var err error
			for try := 1; try <= 3; try++ {
				if r, err = a.Ask(tc.network, tc.addr, 2*time.Second); err == nil {
					break
				}
				t.Logf("%s %s, try %d: %v", tc.network, tc.addr, try, err)
			}
			if err != nil {
				t.Fatalf("%s %s: %v", tc.network, tc.addr, err)
			}
			if host, _, _ := net.SplitHostPort(r.Source); r.Name != "b" || host != tc.src {
				t.Fatalf("%s %s: reply %+v, want from b seeing %s", tc.network, tc.addr, r, tc.src)
			}
		}
		p := b.Start(t, "sleeper", nil, "sleep", "600")
		pid = p.Pid()
		if ok, _ := p.Exited(); ok {
			t.Fatal("sleep exited at once")
		}
	})
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(Dir, n)); !os.IsNotExist(err) {
			t.Errorf("namespace %s still exists after its test ended (%v)", n, err)
		}
	}
	if pid == 0 { // the inner test failed before it started the process
		return
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("process %d started in the namespace still runs after its test ended", pid)
	}
}

// Do switches only its own thread, and back: a sysctl written inside lands
// in the namespace, and the caller's thread stays where it was.
func TestDoStaysInside(t *testing.T) {
	n := New(t, "ohtd-")
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	n.Sysctl(t, "net.ipv4.ip_forward", "1")
	var inside, insideNS string
	err = n.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		inside = strings.TrimSpace(string(b))
		if err == nil {
			insideNS, err = os.Readlink("/proc/thread-self/ns/net")
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside != "1" {
		t.Errorf("ip_forward inside = %q after setting it to 1", inside)
	}
	if insideNS == before {
		t.Errorf("Do ran fn in the caller's namespace %s", before)
	}
	after, _ := os.Readlink("/proc/thread-self/ns/net")
	if after != before {
		t.Errorf("caller's thread moved from %s to %s", before, after)
	}
	// The package-level form reaches the same namespace by name.
	var byName string
	if err := Do(n.Name, func() error {
		var err error
		byName, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil || byName != insideNS {
		t.Errorf("Do(%q) ran in %s (%v), want %s", n.Name, byName, err, insideNS)
	}
	if out := n.Run(t, "cat", "/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(out) != "1" {
		t.Errorf("a command run inside reads ip_forward %q", out)
	}
}

// Sweep deletes a namespace whose owner is gone and leaves live ones alone.
func TestSweepRemovesOrphans(t *testing.T) {
	RequireRoot(t)
	ctx := context.Background()
	live := New(t, "ohts-")
	orphan := Prefix + "2147483647-" + randHex(4) // a pid beyond pid_max
	if err := Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Delete(context.Background(), orphan) })
	Sweep(ctx, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if _, err := os.Stat(filepath.Join(Dir, orphan)); !os.IsNotExist(err) {
		t.Errorf("orphan %s survived Sweep (%v)", orphan, err)
	}
	if _, err := os.Stat(filepath.Join(Dir, live.Name)); err != nil {
		t.Errorf("live namespace %s was swept: %v", live.Name, err)
	}
}

// The node topology routes: both clients reach every pod through the node
// (forwarding, no NAT: the pod sees the client's address), over IPv4 and
// IPv6, and the node's default route leads to the upstream.
func TestNodeTopologyRoutes(t *testing.T) {
	tp := NewNodeTopology(t, 2)
	for i := range tp.Pods {
		for _, c := range []struct {
			from *NS
			addr netip.Addr
			src  string
		}{
			{tp.Client, PodIP(i), ClientIP},
			{tp.Client, PodIP6(i), ClientIP6},
			{tp.Client2, PodIP(i), Client2IP},
		} {
			for _, network := range []string{"tcp", "udp"} {
				addr := netip.AddrPortFrom(c.addr, EchoPort).String()
				r, err := c.from.Ask(network, addr, 2*time.Second)
				if err != nil {
					t.Fatalf("%s %s from %s: %v", network, addr, c.from.Name, err)
				}
				if host, _, _ := net.SplitHostPort(r.Source); r.Name != PodName(i) || host != c.src {
					t.Errorf("%s %s: reply %+v, want %s seeing %s", network, addr, r, PodName(i), c.src)
				}
			}
		}
	}
	if out := tp.Node.IP(t, "route", "get", "203.0.113.1"); !strings.Contains(out, "via "+UpstreamIP) {
		t.Errorf("node's route to an outside address does not lead upstream: %s", out)
	}
}
