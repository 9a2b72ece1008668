package nft

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/portal"
)

// manyRanges returns n /25s, none touching another, far from the test clients, and the /32s of
// allowed, plus the neighbours of refused so that a refused client sits
// between two allowed ranges.
func manyRanges(n int, allowed, refused string) []netip.Prefix {
	var out []netip.Prefix
	for i := 0; i < n; i++ {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 25))
	}
	r := netip.MustParseAddr(refused)
	out = append(out, netip.PrefixFrom(netip.MustParseAddr(allowed), 32), netip.PrefixFrom(r.Prev(), 32), netip.PrefixFrom(r.Next(), 32))
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// rangeSets returns the Services' sets of source ranges in the table.
func rangeSetsIn(t *testing.T, tp *topo) []string {
	t.Helper()
	var out []string
	for _, s := range readTable(t, tp).sets {
		if isRangeSet(s.name) {
			out = append(out, s.name)
		}
	}
	return out
}

// TestManySourceRanges: a thousand source ranges are one set that the
// Service's one fw chain looks up with one rule; real packets from an allowed
// client pass and from a refused one (between two allowed ranges) are
// dropped, on TCP and UDP. New ranges refill the set without touching a
// rule, a full sync and a restart over the unchanged table send nothing,
// and the set leaves with the ranges.
func TestManySourceRanges(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	mk := func(ranges []netip.Prefix) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.LoadBalancerIPs = []netip.Addr{lbIP}
			p.SourceRanges = ranges
			p.ClusterEndpoints = eps(8080, 0, 1)
		})
	}
	lb := netip.AddrPortFrom(lbIP, 80).String()
	first := manyRanges(1000, clientIP, client2IP)
	st := tp.sync(t, snapshot(mk(first)), true)
	t.Logf("first sync with %d ranges: %d messages", len(first), st.Messages)
	for _, network := range []string{"tcp", "udp"} {
		ask(t, tp.client, network, lb, 2)
		mustDrop(t, tp.client2, network, lb)
	}
	if got := rangeSetsIn(t, tp); !slices.Equal(got, []string{"sr4/default/web"}) {
		t.Errorf("sets of source ranges: %v, want one for the Service", got)
	}
	k := readTable(t, tp)
	if n := len(k.rules[fwChain]); n != 1 {
		t.Errorf("chain %s has %d rules, want 1 (a lookup that drops)", fwChain, n)
	}
	if got := firewallChains(k); !slices.Equal(got, []string{fwChain}) {
		t.Errorf("firewall chains %v, want one for the Service", got)
	}
	drops := dropCount(t, tp, fwChain)
	if drops == 0 {
		t.Errorf("the refused client's packets are not counted by the fw chain's drop")
	}

	// The ranges change: the set is refilled, no rule is rewritten (the
	// drop counter keeps counting).
	second := manyRanges(1000, client2IP, clientIP)
	st = tp.sync(t, snapshot(mk(second)), false)
	t.Logf("new ranges: %d messages", st.Messages)
	if st.Messages > 10 {
		t.Errorf("new ranges took %d messages: more than a refill of one set", st.Messages)
	}
	for _, network := range []string{"tcp", "udp"} {
		ask(t, tp.client2, network, lb, 2)
		mustDrop(t, tp.client, network, lb)
	}
	if n := dropCount(t, tp, fwChain); n <= drops {
		t.Errorf("drop counter went from %d to %d: the fw chain was rewritten", drops, n)
	}

	// A full sync, and a new process, over the unchanged table send nothing.
	if st := tp.sync(t, snapshot(mk(second)), true); st.Messages != 0 {
		t.Errorf("a full sync over an unchanged table with source ranges sent %d messages, want 0", st.Messages)
	}
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	if st := tp.sync(t, snapshot(mk(second)), true); st.Messages != 0 {
		t.Errorf("a restart over an unchanged table with source ranges sent %d messages, want 0", st.Messages)
	}
	// A restart that finds other ranges refills the set in place.
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	tp.sync(t, snapshot(mk(first)), true)
	ask(t, tp.client, "tcp", lb, 1)
	mustDrop(t, tp.client2, "tcp", lb)
	if err := tp.b.Check(context.Background()); err != nil {
		t.Errorf("drift check: %v", err)
	}

	// Without ranges the set leaves, and everyone is let in.
	tp.sync(t, snapshot(mk(nil)), false)
	ask(t, tp.client2, "tcp", lb, 1)
	ask(t, tp.client, "tcp", lb, 1)
	if got := rangeSetsIn(t, tp); len(got) != 0 {
		t.Errorf("sets of source ranges left behind: %v", got)
	}
	if got := firewallChains(readTable(t, tp)); len(got) != 0 {
		t.Errorf("firewall chains left behind: %v", got)
	}
	if err := tp.b.Check(context.Background()); err != nil {
		t.Errorf("drift check: %v", err)
	}
	// Back again, then the Service leaves: nothing of it stays.
	tp.sync(t, snapshot(mk(first)), false)
	mustDrop(t, tp.client2, "tcp", lb)
	tp.sync(t, snapshot(), false)
	s := snapshot()
	s.Dirty = []portal.ServiceKey{{Namespace: "default", Name: "web"}}
	tp.sync(t, s, false)
	if got := rangeSetsIn(t, tp); len(got) != 0 {
		t.Errorf("the set of a deleted Service is left behind: %v", got)
	}
	if got := firewallChains(readTable(t, tp)); len(got) != 0 {
		t.Errorf("the firewall chain of a deleted Service is left behind: %v", got)
	}
	// A restart that finds the set of a Service deleted meanwhile removes it.
	tp.sync(t, snapshot(mk(first)), false)
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	tp.sync(t, snapshot(), true)
	if got := rangeSetsIn(t, tp); len(got) != 0 {
		t.Errorf("a full sync left the set of a deleted Service: %v", got)
	}
	if got := firewallChains(readTable(t, tp)); len(got) != 0 {
		t.Errorf("a full sync left the firewall chain of a deleted Service: %v", got)
	}
}

// fwChain is the firewall chain of the Service "web".
const fwChain = "fw4/default/web"

// firewallChains returns the chains of the table that check source ranges.
func firewallChains(k *kernelTable) []string {
	var out []string
	for _, c := range k.chains {
		if strings.HasPrefix(c, kindFirewall) {
			out = append(out, c)
		}
	}
	return out
}

// dropCount is the packet counter of the drop rule of an fw chain.
func dropCount(t *testing.T, tp *topo, chain string) uint64 {
	t.Helper()
	rules := readTable(t, tp).rules[chain]
	if len(rules) == 0 {
		t.Fatalf("chain %s has no rules", chain)
	}
	p, _ := ruleCounter(rules[len(rules)-1])
	return p
}

// Interval elements: ranges merged where they overlap or touch, an end
// after each interval but the one reaching the last address, and printed
// back as nft prints them.
func TestRangeElements(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"10.0.0.0/8"}, "10.0.0.0/8"},
		{[]string{"10.0.0.0/25", "10.0.0.128/25"}, "10.0.0.0/24"},
		{[]string{"10.0.0.0/25", "10.0.0.64/26", "10.0.0.128/26"}, "10.0.0.0-10.0.0.191"},
		{[]string{"10.1.0.0/16", "10.0.0.0/8"}, "10.0.0.0/8"},
		{[]string{"192.0.2.7/32", "255.255.255.0/24"}, "192.0.2.7 255.255.255.0/24"},
		{[]string{"0.0.0.0/0", "10.0.0.0/8"}, "0.0.0.0/0"},
		{[]string{"::ffff:10.0.0.0/104"}, "10.0.0.0/8"},
		{[]string{"fd00::/64", "ffff::/16", "fd00:0:0:1::/64"}, "fd00::/63 ffff::/16"},
		{[]string{"::/0"}, "::/0"},
	} {
		var in []netip.Prefix
		for _, s := range c.in {
			in = append(in, netip.MustParsePrefix(s))
		}
		els := rangeElements(in)
		f := portal.FamilyOf(in[0].Addr())
		s := &setDecl{name: "sr" + fam(f) + "/a/b", flags: 1 /* NFT_SET_INTERVAL */, keyType: dtIPv4, keyLen: uint32(addrLen(f))}
		if f == portal.IPv6 {
			s.keyType = dtIPv6
		}
		if got := strings.Join(intervalTexts(s, els), " "); got != c.want {
			t.Errorf("%v: got %q, want %q (elements %v)", c.in, got, c.want, els)
		}
		for i, e := range els {
			if e.IntervalEnd == (i%2 == 0) {
				t.Errorf("%v: element %d (%x) is not alternately a start and an end", c.in, i, e.Key)
			}
		}
		// Reversed, as the kernel returns them: the same text.
		rev := slices.Clone(els)
		slices.Reverse(rev)
		if got := strings.Join(intervalTexts(s, rev), " "); got != c.want {
			t.Errorf("%v reversed: got %q", c.in, got)
		}
	}
}

// TestHugeServiceDoesNotStopOthers: a Service with 5,000 ports behind
// 1,000 source ranges syncs beside another Service, in one transaction
// and after, and the other's syncs stay as small as without it: its
// endpoint change is an element update, whatever the huge Service holds.
// The ranges add one chain with one rule, not one per port: a sync that
// makes the kernel validate the table (any rule or jump written) walks
// the huge Service's ports once, as it would an ordinary Service's.
func TestHugeServiceDoesNotStopOthers(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	ranges := manyRanges(1000, clientIP, client2IP)
	huge := hugeService(5000, ranges)
	other := func(idx ...int) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, idx...)
			for _, i := range idx { // the pods are on this node; pod0 asks
				p.Hairpin = append(p.Hairpin, podIP(i))
			}
		})
	}
	// Without the huge Service, for comparison.
	tp.sync(t, snapshot(other(0, 1)), true)
	aloneSt := tp.sync(t, snapshot(other(0)), false)
	alone := aloneSt.Messages

	st := tp.sync(t, snapshot(huge, other(0, 1)), false)
	t.Logf("adding a Service of 5,000 ports and %d ranges: %d messages, %v", len(ranges), st.Messages, st.Duration)
	seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 20)
	if len(seen) != 2 {
		t.Errorf("the other Service beside the huge one: %v, want both endpoints", seen)
	}
	lb := netip.AddrPortFrom(lbIP, 14999).String()
	ask(t, tp.client, "tcp", lb, 1)
	mustDrop(t, tp.client2, "tcp", lb)
	k := readTable(t, tp)
	var hugeChains, hugeRules int
	for _, c := range k.chains {
		if strings.Contains(c, "/default/huge") {
			hugeChains++
			hugeRules += len(k.rules[c])
		}
	}
	// A chain per port that picks an endpoint, and the firewall chain.
	if want := len(huge.Portals) + 1; hugeChains != want || hugeRules != want {
		t.Errorf("the huge Service has %d chains and %d rules, want %d of each", hugeChains, hugeRules, want)
	}
	if got := firewallChains(k); !slices.Equal(got, []string{"fw4/default/huge"}) {
		t.Errorf("firewall chains %v, want one for the huge Service", got)
	}
	if n := len(k.elems[setFirewall(portal.IPv4)]); n != len(huge.Portals) {
		t.Errorf("@%s holds %d ways in, want the huge Service's %d", setFirewall(portal.IPv4), n, len(huge.Portals))
	}

	withHuge := tp.sync(t, snapshot(huge, other(0)), false)
	t.Logf("the other Service's endpoint change: %d messages (%v) alone, %d (%v) beside the huge one",
		alone, aloneSt.Duration, withHuge.Messages, withHuge.Duration)
	// At most as many: endpoints the huge Service shares keep their
	// hairpin elements.
	if withHuge.Messages > alone {
		t.Errorf("the other Service's endpoint change took %d messages beside the huge Service, %d without it", withHuge.Messages, alone)
	}
	if seen, _ := ask(t, tp.pods[1], "tcp", "10.96.0.10:80", 10); len(seen) != 1 || seen["pod0"] != 10 {
		t.Errorf("after the other Service's change: %v, want pod0 only", seen)
	}
	// A full sync holds both; so does a restart's.
	if st := tp.sync(t, snapshot(huge, other(0)), true); st.Messages != 0 {
		t.Errorf("a full sync over the unchanged table sent %d messages", st.Messages)
	}
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	st = tp.sync(t, snapshot(huge, other(1)), true)
	t.Logf("a restart's full sync with the other Service changed: %d messages, %v", st.Messages, st.Duration)
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 10); len(seen) != 1 || seen["pod1"] != 10 {
		t.Errorf("after a restart: %v, want pod1 only", seen)
	}
	ask(t, tp.client, "tcp", lb, 1)
	mustDrop(t, tp.client2, "tcp", lb)
}
