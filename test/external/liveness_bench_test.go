package external

import (
	"context"
	"crypto/sha256"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/onehop/onehop/test/nsutil"
)

// TestLivenessMemberlistDetection measures what the Lease mechanism is
// chosen against: hashicorp/memberlist, as MetalLB's speakers run it
// (DefaultLANConfig, a secret key, one member per node), between two of
// the lab's namespaces over real UDP and TCP. One member is killed (its
// sockets close without a goodbye, as when its process dies) or its node
// drops off the link; the time until the survivor declares it dead is
// logged per round. No apiserver is involved at all, which is also how
// memberlist behaves through an apiserver outage: detection goes on.
// The Lease mechanism's numbers come from TestL2HookTakeover (killed
// agent, apiserver up) and TestL2ServesThroughAPIServerOutage.
func TestLivenessMemberlistDetection(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement: several rounds of memberlist's failure detection")
	}
	needs(t)
	lab := newTopo(t)
	lab.add("m1", "m2")
	nsutil.Veth(t, lab.at("m1"), "eth0", []string{"10.9.0.1/24"}, lab.at("m2"), "eth0", []string{"10.9.0.2/24"})
	cases := []struct {
		how  string
		kill func(m *memberlist.Memberlist)
		back func()
	}{
		{"member killed", func(m *memberlist.Memberlist) { _ = m.Shutdown() }, func() {}},
		{"node off the link", func(*memberlist.Memberlist) { lab.ip("m2", "link", "set", "eth0", "down") },
			func() { lab.ip("m2", "link", "set", "eth0", "up") }},
	}
	const rounds = 3
	for _, c := range cases {
		var ds []time.Duration
		for round := range rounds {
			a, aEvents := startMember(t, lab.at("m1"), "node1", "10.9.0.1")
			b, _ := startMember(t, lab.at("m2"), "node2", "10.9.0.2")
			if _, err := b.Join([]string{"10.9.0.1:7946"}); err != nil {
				t.Fatal(err)
			}
			if _, ok := waitFor(context.Background(), 10*time.Second, func() bool { return a.NumMembers() == 2 && b.NumMembers() == 2 }); !ok {
				t.Fatalf("%s round %d: members never met", c.how, round)
			}
			t0 := time.Now()
			c.kill(b)
			at, ok := waitLeave(aEvents, "node2", 60*time.Second)
			if !ok {
				t.Fatalf("%s round %d: node2 not declared dead within 60 s", c.how, round)
			}
			ds = append(ds, at.Sub(t0))
			_ = a.Shutdown()
			_ = b.Shutdown()
			c.back()
		}
		slices.Sort(ds)
		t.Logf("memberlist (DefaultLANConfig, 2 members), %s: declared dead after %v (min), %v (median), %v (max) over %d rounds",
			c.how, ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), rounds)
	}
}

// startMember runs a memberlist member in namespace ns, configured as
// MetalLB's speaker configures it, on addr:7946; it is shut down when the
// test ends.
func startMember(t *testing.T, ns *nsutil.NS, name, addr string) (*memberlist.Memberlist, chan memberlist.NodeEvent) {
	t.Helper()
	tr, err := newNSTransport(ns, addr, 7946)
	if err != nil {
		t.Fatal(err)
	}
	cfg := memberlist.DefaultLANConfig()
	cfg.Name = name
	cfg.Transport = tr
	cfg.AdvertiseAddr, cfg.AdvertisePort = addr, 7946
	key := sha256.Sum256([]byte("lab secret"))
	cfg.SecretKey = key[:]
	cfg.LogOutput = io.Discard
	events := make(chan memberlist.NodeEvent, 1024)
	cfg.Events = &memberlist.ChannelEventDelegate{Ch: events}
	m, err := memberlist.Create(cfg)
	if err != nil {
		_ = tr.Shutdown()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m, events
}

// waitLeave returns when node was declared gone (a NodeLeave event).
func waitLeave(events chan memberlist.NodeEvent, node string, timeout time.Duration) (time.Time, bool) {
	deadline := time.After(timeout)
	for {
		select {
		case e := <-events:
			if e.Event == memberlist.NodeLeave && e.Node.Name == node {
				return time.Now(), true
			}
		case <-deadline:
			return time.Time{}, false
		}
	}
}

// nsTransport is memberlist's transport over sockets opened inside a
// network namespace (memberlist's own NetTransport would listen and dial
// from the test's namespace).
type nsTransport struct {
	ns      *nsutil.NS
	ip      net.IP
	port    int
	udp     net.PacketConn
	tcp     net.Listener
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newNSTransport(ns *nsutil.NS, addr string, port int) (*nsTransport, error) {
	hostPort := net.JoinHostPort(addr, "7946")
	udp, err := ns.ListenPacket("udp", hostPort)
	if err != nil {
		return nil, err
	}
	tcp, err := ns.Listen("tcp", hostPort)
	if err != nil {
		_ = udp.Close()
		return nil, err
	}
	tr := &nsTransport{ns: ns, ip: net.ParseIP(addr), port: port, udp: udp, tcp: tcp,
		packets: make(chan *memberlist.Packet, 256), streams: make(chan net.Conn, 16), done: make(chan struct{})}
	tr.wg.Add(2)
	go func() {
		defer tr.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			select {
			case tr.packets <- &memberlist.Packet{Buf: slices.Clone(buf[:n]), From: from, Timestamp: time.Now()}:
			case <-tr.done:
				return
			}
		}
	}()
	go func() {
		defer tr.wg.Done()
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			select {
			case tr.streams <- c:
			case <-tr.done:
				_ = c.Close()
				return
			}
		}
	}()
	return tr, nil
}

func (tr *nsTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return tr.ip, tr.port, nil
}

func (tr *nsTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = tr.udp.WriteTo(b, ua)
	return time.Now(), err
}

func (tr *nsTransport) PacketCh() <-chan *memberlist.Packet { return tr.packets }

func (tr *nsTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return tr.ns.Dial(ctx, "tcp", addr)
}

func (tr *nsTransport) StreamCh() <-chan net.Conn { return tr.streams }

func (tr *nsTransport) Shutdown() error {
	tr.once.Do(func() {
		close(tr.done)
		_ = tr.udp.Close()
		_ = tr.tcp.Close()
	})
	tr.wg.Wait()
	return nil
}
