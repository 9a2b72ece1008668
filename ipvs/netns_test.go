package ipvs

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
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

// testNet is a node namespace (where the backend runs), a client namespace
// outside the cluster network and pod namespaces, all joined by veths:
//
//	client 192.168.50.2 --- 192.168.50.1 node 10.244.i.1 --- 10.244.i.2 pod i
type testNet struct {
	t      *testing.T
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

func newTestNet(t *testing.T, pods int) *testNet {
	requireIPVS(t)
	n := &testNet{t: t}
	node, client := nsutil.New(t, "ohn-"), nsutil.New(t, "ohc-")
	n.node, n.client = node.Name, client.Name
	nsutil.Veth(t, node, "c0", []string{nodeIP + "/24", nodeIP6 + "/64"}, client, "eth0", []string{clientIP + "/24", clientIP6 + "/64"})
	client.IP(t, "route", "add", "default", "via", nodeIP)
	client.IP(t, "-6", "route", "add", "default", "via", nodeIP6)
	for i := 1; i <= pods; i++ {
		pod := nsutil.New(t, "ohp-")
		n.pods = append(n.pods, pod.Name)
		gw6 := fmt.Sprintf("fd00:244:%d::1", i)
		nsutil.Veth(t, node, fmt.Sprintf("p%d", i), []string{podGW(i) + "/24", gw6 + "/64"}, pod, "eth0", []string{podIP(i) + "/24", podIP6(i) + "/64"})
		pod.IP(t, "route", "add", "default", "via", podGW(i))
		pod.IP(t, "-6", "route", "add", "default", "via", gw6)
		n.serve(i, pod.Name)
	}
	node.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	node.Sysctl(t, "net.ipv4.ip_forward", "1")
	return n
}

// serve runs, in pod i, a TCP server on :8080 that greets each connection
// with "pod-i <client address>" and then echoes lines, and a UDP server on
// :5353 that answers each datagram with the same greeting.
func (n *testNet) serve(i int, ns string) {
	var ln net.Listener
	var pc net.PacketConn
	if err := nsutil.Do(ns, func() (err error) {
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
	if err := nsutil.Do(ns, func() (err error) {
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
	if err := nsutil.Do(ns, func() (err error) {
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
	if err := nsutil.Do(n.node, func() (err error) {
		tb.b, err = New(cfg, opts...)
		return err
	}); err != nil {
		n.t.Fatalf("New: %v", err)
	}
	n.t.Cleanup(func() {
		_ = nsutil.Do(n.node, func() error { return tb.b.Cleanup(context.Background()) })
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
	if err := nsutil.Do(tb.ns, func() (err error) {
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
	if err := nsutil.Do(tb.ns, func() (err error) {
		st, err = tb.b.Sync(context.Background(), snap, false)
		return err
	}); err != nil {
		tb.t.Fatalf("Sync: %v", err)
	}
	return st
}

func (tb *backend) do(fn func(b *Backend) error) error {
	return nsutil.Do(tb.ns, func() error { return fn(tb.b) })
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
