package nft

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// envInt reads a test size from the environment (for longer manual runs).
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// dialer opens many connections from inside a namespace on one OS thread,
// so that a long loop does not create a thread per connection.
type dialer struct {
	reqs chan dialReq
}

type dialReq struct {
	addr  string
	reply chan dialRes
}

type dialRes struct {
	server string
	err    error
}

func newDialer(t *testing.T, n *nsutil.NS) *dialer {
	d := &dialer{reqs: make(chan dialReq)}
	ready := make(chan struct{})
	go func() {
		_ = n.Do(func() error {
			close(ready)
			for r := range d.reqs {
				rep, err := askOnce(r.addr)
				r.reply <- dialRes{rep, err}
			}
			return nil
		})
	}()
	<-ready
	t.Cleanup(func() { close(d.reqs) })
	return d
}

func askOnce(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	r, err := nsutil.AskOn(c, 3*time.Second)
	return r.Name, err
}

func (d *dialer) ask(addr string) (string, error) {
	r := dialReq{addr: addr, reply: make(chan dialRes, 1)}
	d.reqs <- r
	res := <-r.reply
	return res.server, res.err
}

// TestNoConnectionEscapesDNAT is the regression test of new connections
// failing although the Service is healthy: with 10k Services programmed, a
// pod opens thousands of new TCP connections to a Service with one endpoint
// while the runner's drift check reads the table back as often as the agent
// does; then the endpoint is replaced, again and again, the way a pod dies:
// the old one stops answering before the node hears of it, connections
// opened in that gap go nowhere, and the sync (with the conntrack cleanup
// the agent runs after it) moves the Service to the new pod. Every
// connection after a sync must reach the new endpoint, including the ones
// that reuse a source port of a connection lost in the gap (the client
// cycles through its 4096 ephemeral ports every few seconds here). An escaped SYN
// would be routed upstream, where the Service CIDR is unreachable.
func TestNoConnectionEscapesDNAT(t *testing.T) {
	t.Parallel()
	services := envInt("ONEHOP_STEADY_SERVICES", 10000)
	conns := envInt("ONEHOP_STEADY_CONNS", 5000)
	flips := envInt("ONEHOP_STEADY_FLIPS", 20)
	perFlip := envInt("ONEHOP_STEADY_PER_FLIP", 300)

	tp := newTopo(t, 3) // pods 0 and 1 serve, pod 2 is the client
	tp.upstream.IP(t, "route", "add", "unreachable", "10.96.0.0/12")
	// A client with few source ports (a busy proxy, or many clients
	// behind one address) reuses each within seconds: what a lost
	// connection leaves behind is met again at once.
	tp.pods[2].Sysctl(t, "net.ipv4.ip_local_port_range", "40000 44095")
	tp.pods[2].Sysctl(t, "net.ipv4.tcp_tw_reuse", "1")
	ct := dataplane.NewConntrackCleaner(nil, tp.node.FD())
	t.Cleanup(ct.Close)
	snap := bigSnapshot(services, 10)
	probeIP := netip.MustParseAddr("10.96.250.1")
	probe := func(ep int) *portal.Service {
		return service("probe", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{probeIP}
			p.ClusterEndpoints = eps(8080, ep)
		})
	}
	snap.Services[probe(0).Key] = probe(0)
	tp.sync(t, snap, true)
	if _, err := ct.Apply(snap); err != nil {
		t.Fatal(err)
	}

	// The drift check, as often as the agent runs it, and never at the
	// same time as a sync (the runner serialises them).
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	checks := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			mu.Lock()
			if err := tp.b.Check(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("drift check on an untouched table: %v", err)
			}
			checks++
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-done }()

	d := newDialer(t, tp.pods[2])
	addr := netip.AddrPortFrom(probeIP, 80).String()
	failures := map[string]int{}
	total := 0
	askN := func(what string, n int, want string) {
		for i := 0; i < n; i++ {
			total++
			name, err := d.ask(addr)
			var op *net.OpError
			switch {
			case errors.As(err, &op):
				failures[what+": "+op.Err.Error()]++
			case err != nil:
				failures[what+": "+err.Error()]++
			case name != want:
				failures[what+": reached "+name]++
			}
		}
	}

	start := time.Now()
	askN("steady", conns, "pod0")
	t.Logf("steady state: %d new connections in %v with %d Services, %d drift checks", conns, time.Since(start).Round(time.Millisecond), services+1, checks)

	var settle []time.Duration
	var cleanup time.Duration
	lost := 0
	cur := 0
	for f := 0; f < flips; f++ {
		next := 1 - cur
		// The current endpoint dies before the node hears of it.
		dead := tp.pods[cur]
		dead.IP(t, "addr", "flush", "dev", "eth0")
		var lostPorts []int
		for k := 0; k < 3; k++ {
			port := 50000 + 3*f + k // outside the client's ephemeral range
			if _, err := dialFrom(tp.pods[2], port, addr, 150*time.Millisecond); err == nil {
				t.Fatalf("flip %d: a dead endpoint answered", f)
			}
			lostPorts = append(lostPorts, port)
			lost++
		}
		snap.Services[probe(next).Key] = probe(next)
		snap.Dirty = []portal.ServiceKey{probe(next).Key}
		mu.Lock()
		_, err := tp.b.Sync(ctx, snap, false)
		mu.Unlock()
		synced := time.Now()
		if err != nil {
			t.Fatalf("flip %d: sync: %v", f, err)
		}
		want := fmt.Sprintf("pod%d", next)
		askN("after a flip", 1, want)
		settle = append(settle, time.Since(synced))
		// The agent runs the conntrack cleanup right after each sync.
		cleaning := time.Now()
		if _, err := ct.Apply(snap); err != nil {
			t.Fatalf("flip %d: conntrack cleanup: %v", f, err)
		}
		cleanup = max(cleanup, time.Since(cleaning))
		// The client reuses the source ports of the lost connections.
		for _, port := range lostPorts {
			total++
			if name, err := dialFrom(tp.pods[2], port, addr, 2*time.Second); err != nil || name != want {
				failures[fmt.Sprintf("after a flip, from the source port of a lost connection: %q %v", name, err)]++
			}
		}
		askN("after a flip", perFlip-1, want)
		// The dead pod's address comes back for a later flip.
		dead.IP(t, "addr", "add", podIP(cur).String()+"/24", "dev", "eth0")
		dead.IP(t, "route", "add", "default", "via", netip.AddrFrom4([4]byte{10, 244, byte(cur + 1), 1}).String())
		cur = next
	}
	slices.Sort(settle)
	if len(settle) > 0 {
		t.Logf("%d endpoint flips, %d connections lost in the gaps before the syncs; the first connection after a sync answered within %v of it (p50; max %v); the conntrack cleanup took at most %v",
			flips, lost, settle[len(settle)/2].Round(time.Microsecond), settle[len(settle)-1].Round(time.Microsecond), cleanup.Round(time.Microsecond))
	}
	askN("steady after the flips", conns, fmt.Sprintf("pod%d", cur))
	t.Logf("%d connections checked", total)
	for k, n := range failures {
		t.Errorf("%d× %s", n, k)
	}
}

// reuseAddr lets a socket bind the source port of one that just failed.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// dialFrom opens a TCP connection from a fixed source port (0: any) inside
// n and asks the echo server behind it for its name. The client's own stack
// may still hold that port towards addr in TIME_WAIT from an earlier
// connection (EADDRNOTAVAIL, allowed again after a second with
// tcp_tw_reuse): that is waited out, it says nothing of the dataplane.
func dialFrom(n *nsutil.NS, port int, addr string, timeout time.Duration) (string, error) {
	var name string
	err := n.Do(func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{Port: port}, Control: reuseAddr}
		c, err := d.Dial("tcp", addr)
		for try := 0; errors.Is(err, syscall.EADDRNOTAVAIL) && try < 30; try++ {
			time.Sleep(100 * time.Millisecond)
			c, err = d.Dial("tcp", addr)
		}
		if err != nil {
			return err
		}
		defer c.Close()
		r, err := nsutil.AskOn(c, timeout)
		name = r.Name
		return err
	})
	return name, err
}

// TestHalfOpenFlowsDoNotCaptureNewConnections: a SYN that went nowhere (to
// an endpoint that died before the node heard of it, or through an address
// the node did not serve yet) leaves a SYN_SENT conntrack entry that lives
// for two minutes and pins its NAT decision. A client that reuses the same
// source port within that time joins the dead entry instead of being
// balanced afresh: its connection fails although the Service is healthy.
// After the sync and the conntrack cleanup that follow such a change, the
// same source port must reach the new endpoint.
func TestHalfOpenFlowsDoNotCaptureNewConnections(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	tp.upstream.IP(t, "route", "add", "unreachable", "203.0.113.0/24")
	ct := dataplane.NewConntrackCleaner(nil, tp.node.FD())
	t.Cleanup(ct.Close)
	apply := func(snap *portal.Snapshot) {
		t.Helper()
		tp.sync(t, snap, false)
		if _, err := ct.Apply(snap); err != nil {
			t.Fatalf("conntrack cleanup: %v", err)
		}
	}
	probe := func(ep int) *portal.Service {
		return service("probe", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ExternalIPs = []netip.Addr{extIP}
			p.ClusterEndpoints = eps(8080, ep)
		})
	}

	// An address the node does not serve yet: the SYN is routed on
	// without DNAT, and the upstream answers host unreachable.
	const port = 40123
	ext := netip.AddrPortFrom(extIP, 80).String()
	apply(snapshot())
	if name, err := dialFrom(tp.client, port, ext, time.Second); err == nil {
		t.Fatalf("%s answered (%s) before it was programmed", ext, name)
	}
	apply(snapshot(probe(0)))
	if name, err := dialFrom(tp.client, port, ext, 2*time.Second); err != nil || name != "pod0" {
		t.Errorf("external IP, first served: same source port after the sync: got %q, %v; want pod0", name, err)
	}

	// The only endpoint dies (its address is gone, so nothing answers the
	// node's ARP) before the node hears of it: the SYN is DNATed into the
	// void.
	tp.pods[0].IP(t, "addr", "flush", "dev", "eth0")
	addr := netip.AddrPortFrom(clusterIP, 80).String()
	if name, err := dialFrom(tp.pods[1], port, addr, time.Second); err == nil {
		t.Fatalf("dead endpoint answered (%s)", name)
	}
	apply(snapshot(probe(1)))
	if name, err := dialFrom(tp.pods[1], port, addr, 2*time.Second); err != nil || name != "pod1" {
		t.Errorf("endpoint replaced: same source port after the sync: got %q, %v; want pod1", name, err)
	}
}
