package conntrack_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/nft"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// topo is nsutil's NodeTopology, the nft tests' bench, with the nft
// backend and the conntrack cleaner running for the node.
type topo struct {
	*nsutil.NodeTopology
	b       *nft.Backend
	cleaner *dataplane.ConntrackCleaner
}

const nodePort = 30053

func podName(i int) string { return nsutil.PodName(i) }

func newTopo(t *testing.T, pods int) *topo {
	t.Helper()
	tp := &topo{NodeTopology: nsutil.NewNodeTopology(t, pods)}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg := dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")}}
	tp.b = nft.New(cfg, nft.WithNetNS(tp.Node.FD()), nft.WithLogger(log))
	tp.cleaner = dataplane.NewConntrackCleaner(log, tp.Node.FD())
	t.Cleanup(func() {
		tp.cleaner.Close()
		if err := tp.b.Cleanup(context.Background()); err != nil {
			t.Errorf("nft cleanup: %v", err)
		}
	})
	return tp
}

// udpService is one UDP Service port 53 -> 8080 on the cluster IP vip and
// NodePort 30053, with the given pods as endpoints, in vip's family.
func udpService(name, vip string, pods ...int) *portal.Service {
	key := portal.ServiceKey{Namespace: "default", Name: name}
	addr := netip.MustParseAddr(vip)
	p := &portal.Portal{
		Key:        portal.PortKey{Service: key, Port: "dns", Protocol: portal.UDP, Family: portal.FamilyOf(addr)},
		Port:       53,
		ClusterIPs: []netip.Addr{addr},
		NodePort:   nodePort,
	}
	for _, i := range pods {
		ip := nsutil.PodIP(i)
		if addr.Is6() {
			ip = nsutil.PodIP6(i)
		}
		p.ClusterEndpoints = append(p.ClusterEndpoints, netip.AddrPortFrom(ip, nsutil.EchoPort))
	}
	return &portal.Service{Key: key, Portals: []*portal.Portal{p}}
}

func snapshot(svcs ...*portal.Service) *portal.Snapshot {
	s := &portal.Snapshot{
		Node:     portal.Node{Name: "node", NodePortAddrs: []netip.Addr{netip.MustParseAddr(nsutil.NodeIP), netip.MustParseAddr(nsutil.NodeIP6)}},
		Services: map[portal.ServiceKey]*portal.Service{},
	}
	for _, svc := range svcs {
		s.Services[svc.Key] = svc
		s.Dirty = append(s.Dirty, svc.Key)
	}
	return s
}

// sync programs snap; with clean it then runs the cleaner, as the runner's
// OnApplied hook does, and returns when both are done.
func (tp *topo) sync(t *testing.T, snap *portal.Snapshot, clean bool) {
	t.Helper()
	if _, err := tp.b.Sync(context.Background(), snap, false); err != nil {
		t.Fatalf("nft sync: %v", err)
	}
	if !clean {
		return
	}
	began := time.Now()
	n, err := tp.cleaner.Apply(snap)
	if err != nil {
		t.Fatalf("conntrack cleanup: %v", err)
	}
	t.Logf("cleaner deleted %d entries in %v", n, time.Since(began).Round(time.Microsecond))
}

// sender keeps one UDP socket (one source port, hence one conntrack entry)
// sending a datagram every 10ms and records who answers.
type sender struct {
	mu      sync.Mutex
	answers []answer
	stop    chan struct{}
	done    chan struct{}
}

// inFlight covers a datagram sent just before a change whose answer is
// recorded just after it (read deadline plus a send gap).
const inFlight = 100 * time.Millisecond

type answer struct {
	at  time.Time
	pod string // "" when nothing came back
}

func startSender(t *testing.T, from *nsutil.NS, addr string) *sender {
	t.Helper()
	c, err := from.Dial(context.Background(), "udp", addr)
	if err != nil {
		t.Fatalf("udp socket to %s: %v", addr, err)
	}
	s := &sender{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer c.Close()
		buf := make([]byte, 512)
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			_, _ = c.Write([]byte("hello\n"))
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := c.Read(buf)
			a := answer{at: time.Now()}
			var r nsutil.Reply
			if err == nil && json.Unmarshal(buf[:n], &r) == nil {
				a.pod = r.Name
			}
			s.mu.Lock()
			s.answers = append(s.answers, a)
			s.mu.Unlock()
			var ne net.Error
			if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
				time.Sleep(10 * time.Millisecond)
			} else {
				time.Sleep(20 * time.Millisecond) // ICMP error: no endpoint
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *sender) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// waitFor returns when pod first answered after since, or fails after a
// generous liveness bound.
func (s *sender) waitFor(t *testing.T, pod string, since time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		for _, a := range s.answers {
			if a.at.After(since) && a.pod == pod {
				s.mu.Unlock()
				return a.at.Sub(since)
			}
		}
		s.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never answered the running flow within 10s after the change; answers since: %s", pod, s.summary(since))
	return 0
}

// summary counts the answers after since by pod ("-" for none).
func (s *sender) summary(since time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	counts := map[string]int{}
	for _, a := range s.answers {
		if a.at.After(since) {
			name := a.pod
			if name == "" {
				name = "-"
			}
			counts[name]++
		}
	}
	var out []string
	for k, v := range counts {
		out = append(out, k+"="+strconv.Itoa(v))
	}
	return strings.Join(out, " ")
}

// only reports whether every answer in [from, to) came from pod ("" for
// none), and how many there were.
func (s *sender) only(pod string, from, to time.Time) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.answers {
		if a.at.Before(from) || !a.at.Before(to) {
			continue
		}
		n++
		if a.pod != pod {
			return false, n
		}
	}
	return true, n
}

// controlWindow shows that without the cleaner the kernel keeps the flow
// where it was: every answer in a short window still comes from stuck
// ("" = none). Without this the test could pass with a cleaner that does
// nothing.
func controlWindow(t *testing.T, s *sender, stuck string) {
	t.Helper()
	from := time.Now()
	time.Sleep(500 * time.Millisecond)
	ok, n := s.only(stuck, from, time.Now())
	if n == 0 {
		t.Fatalf("control: the sender recorded nothing in 500ms")
	}
	if !ok {
		t.Fatalf("control: without conntrack cleanup the running flow already moved away from %q (%s): "+
			"the stale-entry case this test needs did not happen", stuck, s.summary(from))
	}
	t.Logf("control: without cleanup, %d datagrams in 500ms all stayed stuck on %q", n, stuck)
}

// An endpoint goes away: the running flow is DNATed to it by its conntrack
// entry until the cleaner deletes the entry; then the next datagram reaches
// the new endpoint.
func TestUDPFlowFollowsEndpointChange(t *testing.T) {
	for _, tc := range []struct{ name, vip, addr string }{
		{"ClusterIP", "10.96.0.53", "10.96.0.53:53"},
		{"NodePort", "10.96.0.53", nsutil.NodeIP + ":30053"},
		{"ClusterIPv6", "fd00:96::53", "[fd00:96::53]:53"},
		{"NodePortIPv6", "fd00:96::53", "[" + nsutil.NodeIP6 + "]:30053"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTopo(t, 2)
			tp.sync(t, snapshot(udpService("dns", tc.vip, 0)), true)
			s := startSender(t, tp.Client, tc.addr)
			s.waitFor(t, podName(0), time.Time{})

			tp.sync(t, snapshot(udpService("dns", tc.vip, 1)), false)
			controlWindow(t, s, podName(0))

			began := time.Now()
			if _, err := tp.cleaner.Apply(snapshot(udpService("dns", tc.vip, 1))); err != nil {
				t.Fatal(err)
			}
			d := s.waitFor(t, podName(1), began)
			t.Logf("%s: flow reached the new endpoint %v after the cleanup started", tc.name, d.Round(time.Millisecond))
			from := time.Now()
			time.Sleep(200 * time.Millisecond)
			if ok, _ := s.only(podName(1), from, time.Now()); !ok {
				t.Errorf("after the cleanup the flow does not stay on %s: %s", podName(1), s.summary(from))
			}
		})
	}
}

// The flow starts before its Service exists: its first datagrams are routed
// upstream un-NATed and the kernel remembers that. Once the Service is
// programmed and the cleaner runs, the flow reaches the endpoint.
func TestUDPFlowStartedBeforeServiceRecovers(t *testing.T) {
	tp := newTopo(t, 1)
	tp.sync(t, snapshot(), true)
	s := startSender(t, tp.Client, "10.96.0.54:53")
	time.Sleep(200 * time.Millisecond)

	tp.sync(t, snapshot(udpService("late", "10.96.0.54", 0)), false)
	controlWindow(t, s, "")

	began := time.Now()
	if _, err := tp.cleaner.Apply(snapshot(udpService("late", "10.96.0.54", 0))); err != nil {
		t.Fatal(err)
	}
	d := s.waitFor(t, podName(0), began)
	t.Logf("flow reached the endpoint %v after the cleanup started", d.Round(time.Millisecond))
}

// Scale 1 -> 0 -> 1 (to another pod) and delete + re-create, with a sender
// running throughout and the cleaner run after each sync as the agent
// does: each time the flow recovers within one sync.
func TestUDPFlowAcrossScaleToZeroAndRecreate(t *testing.T) {
	tp := newTopo(t, 2)
	const vip = "10.96.0.55"
	tp.sync(t, snapshot(udpService("cycle", vip, 0)), true)
	s := startSender(t, tp.Client, vip+":53")
	s.waitFor(t, podName(0), time.Time{})

	began := time.Now()
	tp.sync(t, snapshot(udpService("cycle", vip)), true)
	from := time.Now().Add(inFlight) // answers to datagrams sent before the change may still arrive
	time.Sleep(inFlight + 300*time.Millisecond)
	if ok, n := s.only("", from, time.Now()); !ok {
		t.Errorf("with no endpoints the flow still gets answers (%d datagrams): %s", n, s.summary(from))
	}
	t.Logf("scaled to 0 after %v", time.Since(began).Round(time.Millisecond))

	began = time.Now()
	tp.sync(t, snapshot(udpService("cycle", vip, 1)), true)
	t.Logf("scale 0 -> 1: flow reached %s %v after the sync started", podName(1), s.waitFor(t, podName(1), began).Round(time.Millisecond))

	gone := snapshot()
	gone.Dirty = []portal.ServiceKey{{Namespace: "default", Name: "cycle"}}
	tp.sync(t, gone, true)
	from = time.Now().Add(inFlight)
	time.Sleep(inFlight + 300*time.Millisecond)
	if ok, n := s.only("", from, time.Now()); !ok {
		t.Errorf("after the Service was deleted the flow still gets answers (%d datagrams): %s", n, s.summary(from))
	}
	began = time.Now()
	tp.sync(t, snapshot(udpService("cycle", vip, 0)), true)
	t.Logf("re-created: flow reached %s %v after the sync started", podName(0), s.waitFor(t, podName(0), began).Round(time.Millisecond))
}
