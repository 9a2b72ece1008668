package nft

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// A Maglev chain's tag has its own marker: the same fields render another
// rule than a random pick's. Pinned, as TestBodyTagIsPinned.
func TestMaglevBodyTagIsPinned(t *testing.T) {
	b := New(dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, MasqueradeBit: 14})
	body := chainBody{family: portal.IPv4, maglev: true,
		endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.2:8080"), netip.MustParseAddrPort("10.244.2.3:8080")}}
	const want = "onehop8 7 5b1b2f09e3afe84d"
	if got := string(b.bodyTag(7, body)); got != want {
		t.Errorf("bodyTag = %q, want %q", got, want)
	}
	random := body
	random.maglev = false
	if string(b.bodyTag(7, random)) == want {
		t.Errorf("a random chain has the Maglev chain's tag")
	}
	// Endpoints that come and go within one table size are element
	// updates: the rule and its tag stay, and a restart must find them so.
	for _, n := range []int{1, 3, 10} {
		other := body
		other.endpoints = nil
		for i := range n {
			other.endpoints = append(other.endpoints, netip.AddrPortFrom(podIP(i+5), 8080))
		}
		if got := string(b.bodyTag(7, other)); got != want {
			t.Errorf("%d other endpoints: bodyTag = %q, want the same tag %q", n, got, want)
		}
	}
	other := body
	other.endpoints = eps(8080, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	if string(b.bodyTag(7, other)) == want {
		t.Errorf("11 endpoints (another table size) have the tag of 2")
	}
}

// The Go jhash is pinned, for lengths that end in each of its branches:
// TestMaglevSamePickOnEveryNode checks it against the kernel's picks for
// thousands of flows (as root); a change shows here without root.
func TestKernelJhash(t *testing.T) {
	in := []byte("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGH")
	got := []uint32{}
	for _, n := range []int{0, 1, 4, 12, 13, 20, 44} {
		got = append(got, jhash(in[:n], maglevSeed))
	}
	const want = "[1310467159 4118581171 3839892261 292244180 988587328 357149548 199676842]"
	if fmt.Sprint(got) != want {
		t.Errorf("jhash = %v, want %s", got, want)
	}
	if v := kernelJhash(in[:20], maglevSeed, 1021, 0); v >= 1021 {
		t.Errorf("kernelJhash mod 1021 = %d", v)
	}
}

// maglevService is a Service at clusterIP:80/udp whose endpoints are the
// pods idx, balanced by Maglev.
func maglevService(idx ...int) *portal.Service {
	key := portal.ServiceKey{Namespace: "demo", Name: "mg"}
	return &portal.Service{Key: key, Portals: []*portal.Portal{{
		Key:  portal.PortKey{Service: key, Port: "p", Protocol: portal.UDP, Family: portal.IPv4},
		Port: 80, ClusterIPs: []netip.Addr{clusterIP}, ClusterEndpoints: eps(nsutil.EchoPort, idx...),
		Hairpin: []netip.Addr{}, Balancing: portal.BalancingMaglev,
	}}}
}

// clusterIP6 is the IPv6 cluster IP of maglevService6.
var clusterIP6 = netip.MustParseAddr("fd00:96::10")

// maglevService6 is maglevService in IPv6.
func maglevService6(idx ...int) *portal.Service {
	s := maglevService()
	p := s.Portals[0]
	p.Key.Family, p.ClusterIPs = portal.IPv6, []netip.Addr{clusterIP6}
	for _, i := range idx {
		p.ClusterEndpoints = append(p.ClusterEndpoints, netip.AddrPortFrom(podIP6(i), nsutil.EchoPort))
	}
	return s
}

// maglevFlows is how many flows (source ports) the kernel tests send.
const maglevFlows = 3000

// picks sends one UDP datagram from each of count source ports from first
// on of the client's address src to addr and returns the pod that
// answered each.
func picks(t *testing.T, client *nsutil.NS, src string, first, count int, addr string) []string {
	t.Helper()
	dst := net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr))
	out := make([]string, count)
	buf := make([]byte, 4096)
	for i := range out {
		c, err := client.ListenPacket("udp", netip.AddrPortFrom(netip.MustParseAddr(src), uint16(first+i)).String())
		if err != nil {
			t.Fatal(err)
		}
		// A datagram or its answer lost on a busy machine is sent again:
		// the same 5-tuple follows its conntrack entry to the same pod.
		var n int
		for try := 0; try < 3; try++ {
			_ = c.SetDeadline(time.Now().Add(nsutil.EchoTimeout))
			if _, err = c.WriteTo([]byte("hello\n"), dst); err != nil {
				t.Fatal(err)
			}
			if n, _, err = c.ReadFrom(buf); err == nil {
				break
			}
		}
		c.Close()
		if err != nil {
			t.Fatalf("flow from port %d to %s: %v", first+i, addr, err)
		}
		var r nsutil.Reply
		if err := json.Unmarshal(buf[:n], &r); err != nil {
			t.Fatalf("reply %q: %v", buf[:n], err)
		}
		out[i] = r.Name
	}
	return out
}

// predicted evaluates the node's ruleset, as `agent trace` does, for the
// same flows as picks, and returns the pod it predicts for each.
func predicted(t *testing.T, tp *topo, src string, first, count int, addr string) []string {
	t.Helper()
	k := readTable(t, tp)
	h, err := nsHandle(tp.node.FD())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	local, err := localAddrs(h)
	if err != nil {
		t.Fatal(err)
	}
	env := &evalEnv{k: k, local: local}
	dst := netip.MustParseAddrPort(addr)
	names := map[netip.Addr]string{}
	for i := range tp.pods {
		names[podIP(i)], names[podIP6(i)] = nsutil.PodName(i), nsutil.PodName(i)
	}
	out := make([]string, count)
	for i := range out {
		pkt := newTracePacket(netip.MustParseAddr(src), dst.Addr(), uint16(first+i), dst.Port(), byte(portal.UDP))
		runs, err := env.paths(pkt, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) != 1 || !runs[0].dnatDone {
			t.Fatalf("flow from port %d: %d paths, want one that DNATs", first+i, len(runs))
		}
		out[i] = names[runs[0].dnat.Addr()]
	}
	return out
}

func flushConntrack(t *testing.T, ns *nsutil.NS) {
	t.Helper()
	h, err := nsHandle(ns.FD())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		t.Fatal(err)
	}
}

func shares(p []string) map[string]int {
	out := map[string]int{}
	for _, n := range p {
		out[n]++
	}
	return out
}

func maglevRuleHandles(t *testing.T, tp *topo, chain string) []uint64 {
	t.Helper()
	conn, err := newConn(tp.node.FD())
	if err != nil {
		t.Fatal(err)
	}
	rules, err := conn.GetRules(tp.b.table, &nftables.Chain{Name: chain, Table: tp.b.table})
	if err != nil {
		t.Fatal(err)
	}
	var hs []uint64
	for _, r := range rules {
		hs = append(hs, r.Handle)
	}
	return hs
}

// Two nodes with the same Service send every flow to the same endpoint:
// thousands of real UDP flows, each from its own source port, answered by
// the pod that got it. The second node lists the endpoints in another
// order and gives the chain another id and endpoint map (another Service
// synced first). The ruleset's evaluation (`agent trace`) predicts every
// pick. Then one endpoint of ten goes: an element update, and the share of
// flows that moved is measured; a new process syncing the same state
// rewrites nothing.
func TestMaglevSamePickOnEveryNode(t *testing.T) {
	t.Parallel()
	const n = 10
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	a, b := newTopo(t, n), newTopo(t, n)
	addr := netip.AddrPortFrom(clusterIP, 80).String()
	const firstPort = 20000

	a.sync(t, snapshot(maglevService(all...)), true)
	other := service("other", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.99")}
		p.ClusterEndpoints = eps(nsutil.EchoPort, 0, 1, 2)
		p.Balancing = portal.BalancingMaglev // a chain, which takes an id
	})
	b.sync(t, snapshot(other), true)
	reversed := maglevService(all...)
	slices.Reverse(reversed.Portals[0].ClusterEndpoints)
	snapB := snapshot(other, reversed)
	snapB.Dirty = []portal.ServiceKey{reversed.Key}
	b.sync(t, snapB, false)
	chain := "svc4/demo/mg/udp/p"
	if a.b.ids[chain] == b.b.ids[chain] {
		t.Fatalf("both nodes gave %s id %d; the test wants them to differ", chain, a.b.ids[chain])
	}

	onA := picks(t, a.client, clientIP, firstPort, maglevFlows, addr)
	onB := picks(t, b.client, clientIP, firstPort, maglevFlows, addr)
	differ := 0
	for i := range onA {
		if onA[i] != onB[i] {
			differ++
		}
	}
	if differ != 0 {
		t.Errorf("%d of %d flows reached another pod on the second node", differ, maglevFlows)
	}
	if want := predicted(t, a, clientIP, firstPort, maglevFlows, addr); !slices.Equal(onA, want) {
		t.Errorf("the ruleset's evaluation predicts other pods than the kernel picked")
	}
	bal := shares(onA)
	if len(bal) != n {
		t.Errorf("%d flows reached %d pods, want all %d: %v", maglevFlows, len(bal), n, bal)
	}
	for pod, c := range bal {
		// Each pod holds 102 or 103 of the 1021 slots; 3000 flows hashed
		// into them give each about 300, within a few standard deviations.
		if c < maglevFlows/n/2 || c > maglevFlows/n*3/2 {
			t.Errorf("%s got %d of %d flows, want about %d", pod, c, maglevFlows, maglevFlows/n)
		}
	}
	t.Logf("%d flows on two nodes, %d endpoints (table of %d slots): %d picks differ; flows per pod %v",
		maglevFlows, n, dataplane.MaglevSize(n), differ, bal)

	// One endpoint goes: only the slots that changed are rewritten.
	before := maglevRuleHandles(t, a, chain)
	const gone = 3
	snap := snapshot(maglevService(slices.Delete(slices.Clone(all), gone, gone+1)...))
	st := a.sync(t, snap, false)
	if after := maglevRuleHandles(t, a, chain); len(before) != 1 || !slices.Equal(before, after) {
		t.Errorf("removing an endpoint changed the chain's rules from %v to %v; want the same rule", before, after)
	}
	if st.Messages != 2 {
		t.Errorf("removing an endpoint took %d messages, want 2 (the changed slots out, and in)", st.Messages)
	}
	flushConntrack(t, a.node)
	moved := picks(t, a.client, clientIP, firstPort, maglevFlows, addr)
	count, own := 0, 0
	for i := range onA {
		if onA[i] == nsutil.PodName(gone) {
			own++
		}
		if moved[i] == nsutil.PodName(gone) {
			t.Fatalf("flow %d still reached the removed %s", i, moved[i])
		}
		if moved[i] != onA[i] {
			count++
		}
	}
	share := float64(count) / maglevFlows
	t.Logf("1 of %d endpoints removed: %d of %d flows moved (%.1f%%; %.1f%% were on the removed endpoint; 1/N = %.1f%%)",
		n, count, maglevFlows, 100*share, 100*float64(own)/maglevFlows, 100.0/n)
	if share > 1.0/n+0.06 {
		t.Errorf("%.1f%% of the flows moved when 1 of %d endpoints went, want near 1/N (at most %.1f%%)", 100*share, n, 100*(1.0/n+0.06))
	}
	if want := predicted(t, a, clientIP, firstPort, maglevFlows, addr); !slices.Equal(moved, want) {
		t.Errorf("after the removal, the ruleset's evaluation predicts other pods than the kernel picked")
	}

	// A new process finds the table as it would write it.
	fresh := New(a.b.cfg, WithNetNS(a.node.FD()))
	st, err := fresh.Sync(context.Background(), snap, true)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ReadBack || st.Messages != 0 {
		t.Errorf("a new process read the table back: %v, and sent %d messages; want it read and nothing sent", st.ReadBack, st.Messages)
	}
}

// Switching a Service between random and Maglev rewrites its chain and its
// endpoint-map elements both ways; a table size step (10 to 11 endpoints)
// rewrites the rule; the trace says the pick depends on the hash.
func TestMaglevSwitchAndResize(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	chain := "svc4/demo/mg/udp/p"
	elems := func() int {
		k := readTable(t, tp)
		if rules := k.rules[chain]; len(rules) > 0 {
			_, els, _ := k.ruleEndpointElems(rules[0])
			return len(els)
		}
		return flatElems(k, chain) // random over 2: flat, no chain
	}
	svc := maglevService(0, 1)
	tp.sync(t, snapshot(svc), true)
	if got := elems(); got != dataplane.MaglevSize(2) {
		t.Errorf("maglev: %d endpoint-map elements, want %d", got, dataplane.MaglevSize(2))
	}
	tr, err := tp.b.Trace(context.Background(), dataplane.TraceQuery{From: netip.MustParseAddr(clientIP), SourcePort: 40001,
		To: netip.AddrPortFrom(clusterIP, 80), Protocol: "udp"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(tr)
	if !strings.Contains(string(out), "another source port may reach another endpoint") || len(tr.Outcomes) != 1 {
		t.Errorf("the trace of a Maglev Service does not say the pick depends on the hash, or has %d outcomes: %s", len(tr.Outcomes), out)
	}

	random := maglevService(0, 1)
	random.Portals[0].Balancing = portal.BalancingRandom
	s := snapshot(random)
	tp.sync(t, s, false)
	if got := elems(); got != 2 {
		t.Errorf("random: %d endpoint-map elements, want 2", got)
	}
	tp.sync(t, snapshot(maglevService(0, 1)), false)
	if got := elems(); got != dataplane.MaglevSize(2) {
		t.Errorf("back to maglev: %d endpoint-map elements, want %d", got, dataplane.MaglevSize(2))
	}
	// 11 endpoints (pods 2 to 10 exist only as addresses): a bigger table.
	idx := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tp.sync(t, snapshot(maglevService(idx...)), false)
	if got := elems(); got != dataplane.MaglevSize(11) {
		t.Errorf("11 endpoints: %d endpoint-map elements, want %d", got, dataplane.MaglevSize(11))
	}
	tp.sync(t, snapshot(maglevService(0, 1)), false)
	if got := elems(); got != dataplane.MaglevSize(2) {
		t.Errorf("back to 2 endpoints: %d endpoint-map elements, want %d", got, dataplane.MaglevSize(2))
	}
	if _, err := tp.client.Ask("udp", netip.AddrPortFrom(clusterIP, 80).String(), nsutil.EchoTimeout); err != nil {
		t.Errorf("after the changes: %v", err)
	}
}

// In IPv6 the hash reads 44 bytes of registers: the kernel's picks are
// the ones its evaluation predicts, and the rule prints as nft prints it.
func TestMaglevIPv6(t *testing.T) {
	t.Parallel()
	version := requireNft(t)
	tp := newTopo(t, 4)
	tp.sync(t, snapshot(maglevService6(0, 1, 2, 3)), true)
	addr := netip.AddrPortFrom(clusterIP6, 80).String()
	const flows = 500
	got := picks(t, tp.client, clientIP6, 30000, flows, addr)
	if want := predicted(t, tp, clientIP6, 30000, flows, addr); !slices.Equal(got, want) {
		t.Errorf("the ruleset's evaluation predicts other pods than the kernel picked")
	}
	if bal := shares(got); len(bal) != 4 {
		t.Errorf("%d flows reached %v, want all 4 pods", flows, bal)
	}
	k := readTable(t, tp)
	if !strings.Contains(k.render(), "jhash ip6 saddr . th sport . ip6 daddr . th dport . meta l4proto mod 1021") {
		t.Errorf("the rendering lacks the IPv6 Maglev rule")
	}
	compareWithNft(t, tp, k, version)
}

// testdata/ruleset-maglev.golden shows a Maglev chain and its table, as
// nft prints them.
func TestGoldenMaglevRuleset(t *testing.T) {
	t.Parallel()
	version := requireNft(t)
	tp := newTopo(t, 0)
	tp.sync(t, snapshot(maglevService(1, 2)), true)
	k := readTable(t, tp)
	golden(t, "ruleset-maglev.golden", k.render())
	if !strings.Contains(k.render(), "jhash ip saddr . th sport . ip daddr . th dport . meta l4proto mod 1021 seed 0x6f6e6568 map @endpoints4-") {
		t.Errorf("the rendering lacks the Maglev rule:\n%s", k.render())
	}
	compareWithNft(t, tp, k, version)
	d := k.dump()
	if len(d.Ports) != 1 || len(d.Ports[0].Endpoints) != 2 || d.Ports[0].Balancing != "maglev (1021 slots)" {
		t.Errorf("dump-rules: %+v, want one port with its 2 endpoints, balanced by maglev (1021 slots)", d.Ports)
	}
	var table strings.Builder
	if err := d.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	golden(t, "dump-maglev.golden", table.String())
}
