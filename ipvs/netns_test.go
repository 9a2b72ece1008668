package ipvs

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
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

// serve runs, in pod i, nsutil's echo server named "pod-i" on TCP :8080
// and UDP :5353.
func (n *testNet) serve(i int, ns string) {
	s, err := nsutil.ServeEcho(ns, fmt.Sprintf("pod-%d", i), []int{8080}, []int{5353}, nil)
	if err != nil {
		n.t.Fatalf("pod %d servers: %v", i, err)
	}
	n.t.Cleanup(s.Close)
}

// conn is an open client connection through the dataplane.
type conn struct {
	net.Conn
	// Pod and Source are from the first answer: which pod answered and
	// the client address it saw.
	Pod, Source string
}

// The VM runs these tests under emulation on a shared machine: a dial and an
// answer get more time than nsutil's defaults.
const (
	dialTimeout   = 3 * time.Second
	answerTimeout = 5 * time.Second
)

// dial connects from namespace ns to addr over TCP and asks once.
func (n *testNet) dial(ns, addr string) (*conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	c, err := nsutil.Dialer(ns)(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	r, err := nsutil.AskOn(c, answerTimeout)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("first answer from %s: %w", addr, err)
	}
	return &conn{Conn: c, Pod: r.Name, Source: r.SourceIP()}, nil
}

// echo asks again on the established connection; the same pod must answer.
func (c *conn) echo() error {
	r, err := nsutil.AskOn(c.Conn, answerTimeout)
	if err == nil && r.Name != c.Pod {
		err = fmt.Errorf("answered by %s, the connection was with %s", r.Name, c.Pod)
	}
	return err
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

// udp sends one datagram from ns to addr and returns the reply's pod and
// the source it saw.
func (n *testNet) udp(ns, addr string) (string, string, error) {
	c, err := nsutil.Dialer(ns)(context.Background(), "udp", addr)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	r, err := nsutil.AskOn(c, dialTimeout)
	return r.Name, r.SourceIP(), err
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
