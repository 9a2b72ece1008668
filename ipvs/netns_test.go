package ipvs

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// requireIPVS skips (on the host) or fails (in the test VM, where IPVS must
// be there) when the kernel cannot run these tests.
func requireIPVS(t *testing.T) {
	t.Helper()
	why := ""
	switch {
	case os.Getuid() != 0:
		why = "needs root"
	default:
		if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
			_ = exec.Command("modprobe", "ip_vs").Run()
			if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
				why = "IPVS is missing on this kernel (ip_vs module); go test ./test/vm runs these tests in a VM that has it"
			}
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("ONEHOP_VM") != "" {
		t.Fatalf("inside the test VM but: %s", why)
	}
	t.Skip(why)
}

// inNS runs fn on a fresh OS thread that lives in network namespace ns. The
// thread is never unlocked, so it dies with the goroutine and no other code
// ever runs in the wrong namespace.
func inNS(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromName(ns)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// testNet is a node namespace (where the backend runs), a client namespace
// outside the cluster network and pod namespaces, all joined by veths:
//
//	client 192.168.50.2 --- 192.168.50.1 node 10.244.i.1 --- 10.244.i.2 pod i
type testNet struct {
	t      *testing.T
	id     string
	node   string
	client string
	pods   []string
}

const (
	clientIP = "192.168.50.2"
	nodeIP   = "192.168.50.1"
)

const (
	clientIP6 = "fd00:50::2"
	nodeIP6   = "fd00:50::1"
)

func podIP6(i int) string { return fmt.Sprintf("fd00:244:%d::2", i) }

func podIP(i int) string         { return fmt.Sprintf("10.244.%d.2", i) }
func podGW(i int) string         { return fmt.Sprintf("10.244.%d.1", i) }
func podEP(i int) netip.AddrPort { return netip.MustParseAddrPort(podIP(i) + ":8080") }
func podUDP(i int) netip.AddrPort {
	return netip.MustParseAddrPort(podIP(i) + ":5353")
}

// mkNS creates a named network namespace with lo up and returns a
// netlink handle in it; the namespace is deleted when the test ends.
func mkNS(t *testing.T, name string) (*netlink.Handle, netns.NsHandle) {
	t.Helper()
	if err := func() error {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // the thread ends up in the new namespace and dies with us
			h, err := netns.NewNamed(name)
			if err == nil {
				h.Close()
			}
			errc <- err
		}()
		return <-errc
	}(); err != nil {
		t.Fatalf("netns %s: %v", name, err)
	}
	t.Cleanup(func() { _ = netns.DeleteNamed(name) })
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("lo in %s: %v", name, err)
	}
	return h, ns
}

// upWith sets dev up with address cidr and, when gw is set, a default route.
func upWith(t *testing.T, h *netlink.Handle, dev, cidr, gw string) {
	t.Helper()
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("addr %s on %s: %v", cidr, dev, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	if gw != "" {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
			t.Fatalf("default via %s: %v", gw, err)
		}
	}
}

// addV6 adds an IPv6 address without duplicate address detection (so it
// is usable at once) and, when gw is set, a default route.
func addV6(t *testing.T, h *netlink.Handle, dev, cidr, gw string) {
	t.Helper()
	l, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = unix.IFA_F_NODAD
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("addr %s on %s: %v", cidr, dev, err)
	}
	if gw != "" {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
			t.Fatalf("default via %s: %v", gw, err)
		}
	}
}

// veth makes a veth pair: hostDev in the namespace of h, eth0 in peer.
func veth(t *testing.T, h *netlink.Handle, hostDev string, peer netns.NsHandle) {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = hostDev
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(peer))}); err != nil {
		t.Fatalf("veth %s: %v", hostDev, err)
	}
}

func newTestNet(t *testing.T, pods int) *testNet {
	requireIPVS(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	n := &testNet{t: t, id: hex.EncodeToString(b)}
	n.node, n.client = "ohn-"+n.id, "ohc-"+n.id
	nh, _ := mkNS(t, n.node)
	ch, cns := mkNS(t, n.client)
	veth(t, nh, "c0", cns)
	upWith(t, nh, "c0", nodeIP+"/24", "")
	upWith(t, ch, "eth0", clientIP+"/24", nodeIP)
	addV6(t, nh, "c0", nodeIP6+"/64", "")
	addV6(t, ch, "eth0", clientIP6+"/64", nodeIP6)
	for i := 1; i <= pods; i++ {
		name := fmt.Sprintf("ohp%d-%s", i, n.id)
		ph, pns := mkNS(t, name)
		n.pods = append(n.pods, name)
		dev := fmt.Sprintf("p%d", i)
		veth(t, nh, dev, pns)
		upWith(t, nh, dev, podGW(i)+"/24", "")
		upWith(t, ph, "eth0", podIP(i)+"/24", podGW(i))
		addV6(t, nh, dev, fmt.Sprintf("fd00:244:%d::1/64", i), "")
		addV6(t, ph, "eth0", podIP6(i)+"/64", fmt.Sprintf("fd00:244:%d::1", i))
		n.serve(i, name)
	}
	if err := inNS(n.node, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// serve runs, in pod i, a TCP server on :8080 that greets each connection
// with "pod-i <client address>" and then echoes lines, and a UDP server on
// :5353 that answers each datagram with the same greeting.
func (n *testNet) serve(i int, ns string) {
	var ln net.Listener
	var pc net.PacketConn
	if err := inNS(ns, func() (err error) {
		if ln, err = net.Listen("tcp", ":8080"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", ":5353")
		return err
	}); err != nil {
		n.t.Fatalf("pod %d servers: %v", i, err)
	}
	var wg sync.WaitGroup
	n.t.Cleanup(func() { ln.Close(); pc.Close(); wg.Wait() })
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				fmt.Fprintf(c, "pod-%d %s\n", i, c.RemoteAddr().(*net.TCPAddr).IP)
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "echo %s\n", sc.Text())
				}
			}()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(fmt.Appendf(nil, "pod-%d %s", i, from.(*net.UDPAddr).IP), from)
		}
	}()
}

// conn is an open client connection through the dataplane.
type conn struct {
	net.Conn
	r *bufio.Reader
	// Pod and Source are from the greeting: which pod answered and the
	// client address it saw.
	Pod, Source string
}

// dial connects from namespace ns to addr over TCP and reads the greeting.
func (n *testNet) dial(ns, addr string) (*conn, error) {
	var c net.Conn
	if err := inNS(ns, func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	}); err != nil {
		return nil, err
	}
	cc := &conn{Conn: c, r: bufio.NewReader(c)}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := cc.r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting from %s: %w", addr, err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		c.Close()
		return nil, fmt.Errorf("bad greeting %q", line)
	}
	cc.Pod, cc.Source = f[0], f[1]
	_ = c.SetDeadline(time.Time{})
	return cc, nil
}

// echo sends a line on an established connection and checks the echo.
func (c *conn) echo(s string) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "%s\n", s); err != nil {
		return err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "echo "+s {
		return fmt.Errorf("echo: got %q", line)
	}
	return nil
}

// get dials, returns (pod, source seen by the pod) and closes.
func (n *testNet) get(t *testing.T, ns, addr string) (string, string) {
	t.Helper()
	c, err := n.dial(ns, addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ns, err)
	}
	c.Close()
	return c.Pod, c.Source
}

// udp sends one datagram from ns to addr and returns the reply's fields.
func (n *testNet) udp(ns, addr string) (string, string, error) {
	var c net.Conn
	if err := inNS(ns, func() (err error) {
		c, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		return "", "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("hi")); err != nil {
		return "", "", err
	}
	buf := make([]byte, 1500)
	m, err := c.Read(buf)
	if err != nil {
		return "", "", err
	}
	f := strings.Fields(string(buf[:m]))
	if len(f) != 2 {
		return "", "", fmt.Errorf("bad udp reply %q", buf[:m])
	}
	return f[0], f[1], nil
}

// backend is a Backend living in the node namespace; every call runs there.
type backend struct {
	t  *testing.T
	ns string
	b  *Backend
}

var testCfg = dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")}}

func (n *testNet) backend(cfg dataplane.Config, opts ...Option) *backend {
	n.t.Helper()
	opts = append([]Option{WithStateFile(filepath.Join(n.t.TempDir(), "state.json"))}, opts...)
	tb := &backend{t: n.t, ns: n.node}
	if err := inNS(n.node, func() (err error) {
		tb.b, err = New(cfg, opts...)
		return err
	}); err != nil {
		n.t.Fatalf("New: %v", err)
	}
	n.t.Cleanup(func() {
		_ = inNS(n.node, func() error { return tb.b.Cleanup(context.Background()) })
		tb.b.Close()
	})
	return tb
}

func (tb *backend) sync(full bool, svcs ...*portal.Service) dataplane.SyncStats {
	tb.t.Helper()
	snap := &portal.Snapshot{Node: portal.Node{Name: "node"}, Services: map[portal.ServiceKey]*portal.Service{}}
	for _, s := range svcs {
		snap.Services[s.Key] = s
		snap.Dirty = append(snap.Dirty, s.Key)
	}
	var st dataplane.SyncStats
	if err := inNS(tb.ns, func() (err error) {
		st, err = tb.b.Sync(context.Background(), snap, full)
		return err
	}); err != nil {
		tb.t.Fatalf("Sync: %v", err)
	}
	return st
}

// remove syncs incrementally with the given Services deleted.
func (tb *backend) remove(keys ...portal.ServiceKey) dataplane.SyncStats {
	tb.t.Helper()
	snap := &portal.Snapshot{Node: portal.Node{Name: "node"}, Services: map[portal.ServiceKey]*portal.Service{}, Dirty: keys}
	var st dataplane.SyncStats
	if err := inNS(tb.ns, func() (err error) {
		st, err = tb.b.Sync(context.Background(), snap, false)
		return err
	}); err != nil {
		tb.t.Fatalf("Sync: %v", err)
	}
	return st
}

func (tb *backend) do(fn func(b *Backend) error) error {
	return inNS(tb.ns, func() error { return fn(tb.b) })
}

func (tb *backend) dump() *dataplane.Dump {
	tb.t.Helper()
	var d *dataplane.Dump
	if err := tb.do(func(b *Backend) (err error) { d, err = b.Dump(context.Background()); return err }); err != nil {
		tb.t.Fatalf("Dump: %v", err)
	}
	return d
}

// svc builds a one-port Service.
func svc(name string, mut func(p *portal.Portal)) *portal.Service {
	k := portal.ServiceKey{Namespace: "test", Name: name}
	p := &portal.Portal{Key: portal.PortKey{Service: k, Port: "http", Protocol: portal.TCP, Family: portal.IPv4}, Port: 80}
	mut(p)
	return &portal.Service{Key: k, Portals: []*portal.Portal{p}}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}
