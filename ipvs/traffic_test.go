package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
)

const vip = "10.96.0.10"

func web(eps ...int) *portal.Service {
	return svc("web", func(p *portal.Portal) {
		p.ClusterIPs = addrs(vip)
		for _, i := range eps {
			p.ClusterEndpoints = append(p.ClusterEndpoints, podEP(i))
		}
	})
}

// TestClusterIP: round robin over both pods, masquerade for clients outside
// the cluster network, the pod's own address kept for pods, UDP too, and a
// second full sync that finds nothing to change.
func TestClusterIP(t *testing.T) {
	n := newTestNet(t, 3)
	b := n.backend(testCfg)
	s := web(1, 2)
	udp := &portal.Portal{Key: portal.PortKey{Service: s.Key, Port: "dns", Protocol: portal.UDP, Family: portal.IPv4},
		Port: 53, ClusterIPs: addrs(vip), ClusterEndpoints: []netip.AddrPort{podUDP(1)}}
	s.Portals = append(s.Portals, udp)
	st := b.sync(true, s)
	t.Logf("first sync: %+v", st)

	seen := map[string]int{}
	for range 4 {
		pod, src := n.get(t, n.client, vip+":80")
		seen[pod]++
		if src == clientIP {
			t.Errorf("client outside the cluster network reached %s unmasqueraded (source %s)", pod, src)
		}
	}
	if seen["pod-1"] != 2 || seen["pod-2"] != 2 {
		t.Errorf("rr over 2 pods, 4 connections: %v", seen)
	}
	pod, src := n.get(t, n.pods[2], vip+":80")
	if src != podIP(3) {
		t.Errorf("pod 3 -> %s: source %s, want its own %s (no masquerade inside the cluster network)", pod, src, podIP(3))
	}
	if pod, _, err := n.udp(n.client, vip+":53"); err != nil || pod != "pod-1" {
		t.Errorf("udp: %q %v", pod, err)
	}

	// The kernel holds what the plan says, in the canonical form a full
	// sync compares with: nothing to change.
	if st := b.sync(true, s); st.Changed != 0 || st.Messages != 0 {
		t.Errorf("second full sync changed %d portals with %d messages; want none", st.Changed, st.Messages)
	}
	if st := b.sync(false, s); st.Messages != 0 {
		t.Errorf("incremental no-op sync sent %d messages", st.Messages)
	}
	if err := b.do(func(b *Backend) error { return b.Check(context.Background()) }); err != nil {
		t.Errorf("Check: %v", err)
	}
	d := b.dump()
	var raw strings.Builder
	_ = d.WriteTable(&raw)
	t.Logf("dump:\n%s\n%s", raw.String(), d.Raw)
	if len(d.Ports) != 2 || d.Ports[0].Service != "test/web:dns/udp/ipv4" || len(d.Ports[1].Endpoints) != 2 {
		t.Errorf("dump ports: %+v", d.Ports)
	}
	// IPVS folds its per-CPU counters into the totals every 2 s.
	for deadline := time.Now().Add(3 * time.Second); d.Ports[1].Packets == 0 && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		d = b.dump()
	}
	if d.Ports[1].Packets == 0 || d.Ports[1].Endpoints[0].Packets == 0 {
		t.Errorf("no packets counted for %s: %+v", d.Ports[1].Service, d.Ports[1])
	}
}

// TestNodePort: a NodePort on the node's address reaches the pods,
// masqueraded (Cluster policy).
func TestNodePort(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	s.Portals[0].NodePort = 30080
	b.sync(true, s)
	seen := map[string]bool{}
	for range 4 {
		pod, src := n.get(t, n.client, nodeIP+":30080")
		seen[pod] = true
		if src == clientIP {
			t.Errorf("NodePort under the Cluster policy kept the client address")
		}
	}
	if len(seen) != 2 {
		t.Errorf("NodePort reached %v, want both pods", seen)
	}
}

// TestSchedulers: every scheduler is accepted by the kernel, shows in the
// dump and carries traffic; sh keeps one client on one pod.
func TestSchedulers(t *testing.T) {
	n := newTestNet(t, 2)
	for _, sched := range []string{"rr", "wrr", "lc", "wlc", "sh", "mh"} {
		b := n.backend(testCfg, WithScheduler(sched))
		b.sync(true, web(1, 2))
		if d := b.dump(); !strings.Contains(d.Raw, "TCP "+vip+":80 "+sched+" ") {
			t.Errorf("%s: kernel has\n%s", sched, d.Raw)
		}
		seen := map[string]int{}
		for range 4 {
			pod, _ := n.get(t, n.client, vip+":80")
			seen[pod]++
		}
		t.Logf("%s: %v", sched, seen)
		switch sched {
		case "rr", "wrr":
			if len(seen) != 2 {
				t.Errorf("%s: want both pods, got %v", sched, seen)
			}
		case "sh", "mh":
			if len(seen) != 1 {
				t.Errorf("%s: one client must stay on one pod, got %v", sched, seen)
			}
		}
		if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHashingDrain: under the hashing schedulers (sh, mh) a client whose
// pod is draining (weight 0, a connection still open) reaches another pod
// with its next connection instead of being refused: sh keeps a draining
// destination's share of its hash table, and without the fallback flag
// refuses the clients it hashes there.
func TestHashingDrain(t *testing.T) {
	n := newTestNet(t, 3)
	for _, sched := range []string{"sh", "mh"} {
		b := n.backend(testCfg, WithScheduler(sched))
		b.sync(true, web(1, 2, 3))
		if d := b.dump(); !strings.Contains(d.Raw, sched+" fallback") {
			t.Errorf("%s: no fallback flag:\n%s", sched, d.Raw)
		}
		c, err := n.dial(n.client, vip+":80")
		if err != nil {
			t.Fatalf("%s: %v", sched, err)
		}
		var rest []int
		for i := 1; i <= 3; i++ {
			if fmt.Sprintf("pod-%d", i) != c.Pod {
				rest = append(rest, i)
			}
		}
		b.sync(false, web(rest...)) // c.Pod drains: c keeps it at weight 0
		for range 3 {
			nc, err := n.dial(n.client, vip+":80")
			if err != nil {
				t.Errorf("%s: a new connection while %s drains: %v", sched, c.Pod, err)
				break
			}
			nc.Close()
			if nc.Pod == c.Pod {
				t.Errorf("%s: a new connection went to draining %s", sched, c.Pod)
			}
		}
		if err := c.echo(); err != nil {
			t.Errorf("%s: the connection to the draining pod: %v", sched, err)
		}
		c.Close()
		if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAffinity: ClientIP affinity is IPVS persistence with the timeout.
func TestAffinity(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	s.Portals[0].Affinity.TimeoutSeconds = 60
	b.sync(true, s)
	seen := map[string]int{}
	for range 5 {
		pod, _ := n.get(t, n.client, vip+":80")
		seen[pod]++
	}
	if len(seen) != 1 {
		t.Errorf("affinity: one client reached %v", seen)
	}
	if d := b.dump(); !strings.Contains(d.Raw, "persistent 60") {
		t.Errorf("no persistence in\n%s", d.Raw)
	}
}

// TestLocalPolicy: externalTrafficPolicy Local sends NodePort traffic to
// the local endpoint only and keeps the client's address; the cluster IP of
// the same port still uses every endpoint.
func TestLocalPolicy(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	p := s.Portals[0]
	p.NodePort, p.ExternalLocal = 30081, true
	p.LocalEndpoints = []netip.AddrPort{podEP(2)}
	b.sync(true, s)
	for range 3 {
		pod, src := n.get(t, n.client, nodeIP+":30081")
		if pod != "pod-2" || src != clientIP {
			t.Errorf("Local NodePort: reached %s seeing source %s; want pod-2 seeing %s", pod, src, clientIP)
		}
	}
	seen := map[string]bool{}
	for range 4 {
		pod, _ := n.get(t, n.client, vip+":80")
		seen[pod] = true
	}
	if len(seen) != 2 {
		t.Errorf("cluster IP under Local external policy reached %v, want both", seen)
	}
}

// TestEndpointChange: removing an endpoint keeps its established
// connection working (weight 0), sends new connections elsewhere, and the
// destination is deleted once drained (bounded by the drain timeout).
func TestEndpointChange(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg, WithDrainTimeout(2*time.Second))
	b.sync(true, web(1, 2))
	var old *conn
	var others []*conn
	for range 4 {
		c, err := n.dial(n.client, vip+":80")
		if err != nil {
			t.Fatal(err)
		}
		if c.Pod == "pod-1" && old == nil {
			old = c
		} else {
			others = append(others, c)
		}
	}
	for _, c := range others {
		c.Close()
	}
	if old == nil {
		t.Fatal("no connection reached pod-1")
	}
	defer old.Close()

	b.sync(false, web(2))
	if err := old.echo(); err != nil {
		t.Errorf("established connection to the removed endpoint broke: %v", err)
	}
	for range 3 {
		if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-2" {
			t.Errorf("new connection went to removed %s", pod)
		}
	}
	if dr := b.b.Draining(); len(dr) != 1 || !strings.Contains(dr[0], podIP(1)) {
		t.Errorf("draining: %v", dr)
	}
	if d := b.dump(); !strings.Contains(d.Raw, podIP(1)+":8080 Masq 0 active=1") {
		t.Errorf("removed endpoint not at weight 0 with its connection:\n%s", d.Raw)
	}
	// Back again before it drained: weight 1, not draining.
	b.sync(false, web(1, 2))
	if dr := b.b.Draining(); len(dr) != 0 {
		t.Errorf("re-added endpoint still draining: %v", dr)
	}
	b.sync(false, web(2))
	old.Close()
	time.Sleep(2500 * time.Millisecond)
	if err := b.do(func(b *Backend) error { return b.Check(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	if dr := b.b.Draining(); len(dr) != 0 {
		t.Errorf("still draining after the timeout: %v", dr)
	}
	if d := b.dump(); strings.Contains(d.Raw, podIP(1)) {
		t.Errorf("drained endpoint still in the kernel:\n%s", d.Raw)
	}
}

// TestRejectNoEndpoints: a Service port without endpoints refuses
// connections at once (ICMP port unreachable), for TCP and UDP.
func TestRejectNoEndpoints(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	s := web()
	s.Portals = append(s.Portals, &portal.Portal{Key: portal.PortKey{Service: s.Key, Port: "dns", Protocol: portal.UDP, Family: portal.IPv4},
		Port: 53, ClusterIPs: addrs(vip)})
	b.sync(true, s)
	start := time.Now()
	_, err := n.dial(n.client, vip+":80")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP without endpoints: %v, want connection refused", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("reject took %v", el)
	}
	if _, _, err := n.udp(n.client, vip+":53"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP without endpoints: %v, want connection refused", err)
	}
	d := b.dump()
	if len(d.Ports) != 2 || d.Ports[0].Note != noEndpointsNote {
		t.Errorf("dump: %+v", d.Ports)
	}
	b.sync(false, web(1))
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("after adding an endpoint: %s", pod)
	}
	// Deleting the Service removes its virtual servers and its VIP.
	b.remove(s.Key)
	if d := b.dump(); len(d.Ports) != 0 {
		t.Errorf("after deleting the Service: %+v\n%s", d.Ports, d.Raw)
	}
	var left []netip.Addr
	if err := b.do(func(b *Backend) (err error) { left, err = b.dummyAddrs(); return err }); err != nil || len(left) != 0 {
		t.Errorf("VIPs left on %s: %v %v", DummyInterface, left, err)
	}
}

// TestSourceRanges: loadBalancerSourceRanges let the client in or drop it.
func TestSourceRanges(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	lb := func(ranges ...string) *portal.Service {
		s := web(1)
		s.Portals[0].LoadBalancerIPs = addrs("203.0.113.10")
		for _, r := range ranges {
			s.Portals[0].SourceRanges = append(s.Portals[0].SourceRanges, netip.MustParsePrefix(r))
		}
		return s
	}
	b.sync(true, lb("192.168.50.0/24", "10.0.0.0/8"))
	if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
		t.Errorf("allowed client reached %s", pod)
	}
	b.sync(false, lb("10.0.0.0/8"))
	if _, err := n.dial(n.client, "203.0.113.10:80"); err == nil {
		t.Errorf("client outside the source ranges got through")
	}
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("cluster IP of the same port is not restricted: %s", pod)
	}
	// The kernel holds the set and the rule in the form a full sync
	// compares with: nothing to change.
	if st := b.sync(true, lb("10.0.0.0/8")); st.Messages != 0 {
		t.Errorf("a second full sync with source ranges sent %d messages", st.Messages)
	}
	// 0.0.0.0/0 (which hash:net cannot hold) lets everyone in.
	b.sync(false, lb("0.0.0.0/0"))
	if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
		t.Errorf("with 0.0.0.0/0: %s", pod)
	}
	b.sync(false, lb())
	if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
		t.Errorf("without source ranges: %s", pod)
	}
	if d := b.dump(); strings.Contains(d.Raw, rangeSetPrefix) {
		t.Errorf("a set left after the ranges went:\n%s", d.Raw)
	}
}

// TestSourceRangesScale: a Service's source ranges cost one iptables rule
// per load-balancer entry and one set lookup, whatever their number. With
// 1 and with 5000 ranges the rules are the same; the set holds the ranges;
// changing one range sends a message or two, not the whole list; allowed
// and refused clients are told apart among 5000 ranges. The time of a
// connection with each is logged.
func TestSourceRangesScale(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	lb := func(count int, client bool) *portal.Service {
		s := web(1)
		p := s.Portals[0]
		p.LoadBalancerIPs = addrs("203.0.113.10", "203.0.113.11")
		for i := range count {
			// 10.x.y.0/24 ranges, none of which holds the client.
			p.SourceRanges = append(p.SourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
		}
		if client {
			p.SourceRanges = append(p.SourceRanges, netip.MustParsePrefix(clientIP+"/32"))
		}
		return s
	}
	inputRules := func() []string {
		d := b.dump()
		var out []string
		for _, l := range strings.Split(d.Raw, "\n") {
			if strings.HasPrefix(l, "-A "+chainInput+" ") {
				out = append(out, l)
			}
		}
		return out
	}
	// The fastest of 10 connections: the least disturbed by the machine.
	timeConns := func() time.Duration {
		best := time.Hour
		for range 10 {
			start := time.Now()
			if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
				t.Fatalf("allowed client reached %q", pod)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	b.sync(true, lb(0, true))
	few := inputRules()
	oneRange := timeConns()
	st := b.sync(false, lb(5000, true))
	t.Logf("adding 5000 ranges: %d messages in %v", st.Messages, st.Duration)
	many := inputRules()
	if !slices.Equal(few, many) || len(many) != 2 {
		t.Errorf("iptables rules with 1 range:\n%s\nwith 5001:\n%s\nwant the same two (one per load-balancer IP)", strings.Join(few, "\n"), strings.Join(many, "\n"))
	}
	if d := b.dump(); !strings.Contains(d.Raw, "hash:net (5001)") {
		t.Errorf("the set does not hold 5001 ranges:\n%.2000s", d.Raw)
	}
	manyRanges := timeConns()
	// Once more each way, so that a drift of the machine shows as one.
	b.sync(false, lb(0, true))
	oneRange2 := timeConns()
	b.sync(false, lb(5000, true))
	manyRanges2 := timeConns()
	t.Logf("fastest of 10 connections through a load-balancer IP: %v, %v with 1 source range; %v, %v with 5001 (one hash:net lookup either way)",
		oneRange, oneRange2, manyRanges, manyRanges2)
	if st := b.sync(false, lb(5001, true)); st.Messages > 2 {
		t.Errorf("adding one range to 5000 sent %d messages, want 1", st.Messages)
	}
	b.sync(false, lb(5000, false))
	if _, err := n.dial(n.client, "203.0.113.10:80"); err == nil {
		t.Error("the client outside 5000 ranges got through")
	}
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("cluster IP: %s", pod)
	}
	if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	left := newPlan()
	if err := b.do(func(b *Backend) error { return b.sets.read(left) }); err != nil || len(left.Sets) != 0 {
		t.Errorf("ipsets after Cleanup: %v %v", sortedKeys(left.Sets), err)
	}
}

// TestCheckCleanup: Check notices a deleted dummy interface and a deleted
// jump (with a canary period of 0, every Check runs the iptables canary);
// a full sync repairs them; Cleanup removes onehop's state and leaves an
// IPVS service someone else made.
func TestCheckCleanup(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg, WithCanaryPeriod(0))
	s := web(1)
	s.Portals[0].NodePort = 30082
	b.sync(true, s)
	check := func() error { return b.do(func(b *Backend) error { return b.Check(context.Background()) }) }
	run := func(args ...string) string {
		out, err := exec.Command("ip", append([]string{"netns", "exec", n.node}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("ip", "link", "del", DummyInterface)
	if err := check(); err == nil {
		t.Error("Check missed the deleted dummy interface")
	}
	b.sync(true, s)
	if err := check(); err != nil {
		t.Errorf("after repair: %v", err)
	}
	run("iptables", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", jumpComment, "-j", chainPostrouting)
	if err := check(); err == nil {
		t.Error("Check missed the deleted jump")
	}
	b.sync(true, s)
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("after repair: %s", pod)
	}
	run("ipvsadm", "-A", "-t", "192.0.2.1:80", "-s", "rr")
	if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	left := run("ipvsadm", "-Ln")
	if !strings.Contains(left, "192.0.2.1:80") || strings.Contains(left, vip) || strings.Contains(left, ":30082") {
		t.Errorf("after Cleanup:\n%s", left)
	}
	if out, _ := exec.Command("ip", "-n", n.node, "link", "show", DummyInterface).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("dummy interface left: %s", out)
	}
	for _, table := range []string{"nat", "filter"} {
		if rules := run("iptables", "-t", table, "-S"); strings.Contains(rules, "ONEHOP") {
			t.Errorf("%s table after Cleanup:\n%s", table, rules)
		}
	}
}

// TestHairpin: a pod reaching itself through its Service is masqueraded,
// or it would answer itself directly and the connection would never open.
func TestHairpin(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	s := web(1)
	s.Portals[0].LocalEndpoints = []netip.AddrPort{podEP(1)}
	b.sync(true, s)
	pod, src := n.get(t, n.pods[0], vip+":80")
	if pod != "pod-1" || src == podIP(1) {
		t.Errorf("hairpin: reached %s seeing %s, want pod-1 seeing the node", pod, src)
	}
}

// TestIPv6: an IPv6 cluster IP and NodePort through ip6tables and IPVS,
// masqueraded for a client outside the cluster network, next to IPv4.
func TestIPv6(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	p6 := &portal.Portal{Key: portal.PortKey{Service: s.Key, Port: "http", Protocol: portal.TCP, Family: portal.IPv6}, Port: 80,
		ClusterIPs: addrs("fd00:96::10"), NodePort: 30090,
		ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("[" + podIP6(1) + "]:8080"), netip.MustParseAddrPort("[" + podIP6(2) + "]:8080")}}
	s.Portals = append(s.Portals, p6)
	b.sync(true, s)
	seen := map[string]bool{}
	for _, addr := range []string{"[fd00:96::10]:80", "[fd00:96::10]:80", "[" + nodeIP6 + "]:30090", "[" + nodeIP6 + "]:30090"} {
		pod, src := n.get(t, n.client, addr)
		seen[pod] = true
		if src == clientIP6 {
			t.Errorf("%s: IPv6 client outside the cluster network not masqueraded", addr)
		}
	}
	if len(seen) != 2 {
		t.Errorf("IPv6 reached %v, want both pods", seen)
	}
	if pod, _ := n.get(t, n.client, vip+":80"); pod == "" {
		t.Error("IPv4 next to IPv6")
	}
	if st := b.sync(true, s); st.Messages != 0 {
		t.Errorf("second full sync with IPv6 sent %d messages", st.Messages)
	}
}

// TestCheckCanaryPeriod: within the canary period Check runs no iptables
// command (it would take the node's xtables lock), so a deleted jump is
// noticed only once the period is over; the dummy interface, read over
// netlink, is checked every time.
func TestCheckCanaryPeriod(t *testing.T) {
	n := newTestNet(t, 1)
	const period = 1500 * time.Millisecond
	b := n.backend(testCfg, WithCanaryPeriod(period))
	b.sync(true, web(1))
	check := func() error { return b.do(func(b *Backend) error { return b.Check(context.Background()) }) }
	canaries := func() int { b.b.mu.Lock(); defer b.b.mu.Unlock(); return b.b.canaries }
	if out, err := exec.Command("ip", "netns", "exec", n.node, "iptables", "-t", "nat", "-D", "POSTROUTING",
		"-m", "comment", "--comment", jumpComment, "-j", chainPostrouting).CombinedOutput(); err != nil {
		t.Fatalf("deleting the jump: %v\n%s", err, out)
	}
	start := time.Now()
	for range 20 {
		err := check()
		if time.Since(start) < period && err != nil {
			t.Fatalf("Check within the canary period after a full sync: %v", err)
		}
	}
	if time.Since(start) < period && canaries() != 0 {
		t.Errorf("%d iptables canaries within the period after a full sync, want 0", canaries())
	}
	// Once the period is over, the next Check runs the canary and sees it.
	time.Sleep(time.Until(start.Add(period)))
	if err := check(); err == nil {
		t.Error("Check after the canary period missed the deleted jump")
	}
	if canaries() != 1 {
		t.Errorf("%d canaries, want 1", canaries())
	}
	// It keeps looking (the failed canary does not count as whole).
	if err := check(); err == nil {
		t.Error("the second Check after a failed canary passed")
	}
	b.sync(true, web(1))
	if err := check(); err != nil {
		t.Errorf("after repair: %v", err)
	}
	// The dummy interface is read on every Check.
	if out, err := exec.Command("ip", "-n", n.node, "link", "del", DummyInterface).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := check(); err == nil {
		t.Error("Check missed the deleted dummy interface within the canary period")
	}
}

// TestStateFileUnwritable: a state file that cannot be written (a
// read-only root filesystem) fails no sync; the names stay in memory, so a
// full sync still recognises and removes the NodePort virtual server of a
// deleted Service, and Dump still names Service ports.
func TestStateFileUnwritable(t *testing.T) {
	n := newTestNet(t, 1)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	b := n.backend(testCfg, WithStateFile(filepath.Join(notDir, "state.json")),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	s := web(1)
	s.Portals[0].NodePort = 30083
	b.sync(true, s)
	b.sync(true, s, svc("other", func(p *portal.Portal) { p.ClusterIPs = addrs("10.96.0.11") }))
	if d := b.dump(); len(d.Ports) != 2 || d.Ports[1].Service != "test/web:http/tcp/ipv4" {
		t.Errorf("dump without a state file: %+v", d.Ports)
	}
	if got := strings.Count(logs.String(), "cannot write the state file"); got != 1 {
		t.Errorf("%d warnings about the state file, want 1:\n%s", got, logs.String())
	}
	b.sync(true) // every Service gone
	out, err := exec.Command("ip", "netns", "exec", n.node, "ipvsadm", "-Ln").CombinedOutput()
	if err != nil {
		t.Fatalf("ipvsadm: %v\n%s", err, out)
	}
	if strings.Contains(string(out), ":30083") || strings.Contains(string(out), vip) {
		t.Errorf("virtual servers left after a full sync without Services:\n%s", out)
	}
}
