package providers

import (
	"fmt"
	"maps"
	"net/netip"
	"testing"

	"github.com/onehop/onehop/portal"
)

// TestTookOver: an IP this node answers for now counts as taken over
// only when another node owned it at the previous look and this node did
// not answer for it then; nothing at the first look.
func TestTookOver(t *testing.T) {
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	s := &State{Node: "node2"}
	for _, tc := range []struct {
		name     string
		before   map[netip.Addr]string
		had, own []netip.Addr
		want     map[netip.Addr]string
	}{
		{"first look", nil, nil, []netip.Addr{a}, map[netip.Addr]string{}},
		{"owner died", map[netip.Addr]string{a: "node1", b: "node2"}, []netip.Addr{b}, []netip.Addr{a, b},
			map[netip.Addr]string{a: "node1"}},
		{"own already, not served before", map[netip.Addr]string{a: "node2"}, nil, []netip.Addr{a}, map[netip.Addr]string{}},
		{"new IP", map[netip.Addr]string{a: "node1"}, nil, []netip.Addr{c}, map[netip.Addr]string{}},
		{"still answering", map[netip.Addr]string{a: "node1"}, []netip.Addr{a}, []netip.Addr{a}, map[netip.Addr]string{}},
	} {
		var before func(netip.Addr) string
		if tc.before != nil {
			before = func(ip netip.Addr) string { return tc.before[ip] }
		}
		had := map[netip.Addr]bool{}
		for _, ip := range tc.had {
			had[ip] = true
		}
		if got := tookOver(s, before, had, tc.own); !maps.Equal(got, tc.want) {
			t.Errorf("%s: tookOver = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestNextHopChanges: the BGP next hops of a Local-policy address are
// the nodes with a ready local endpoint; a change is reported with the
// old ones and the Services holding the address, a Cluster-policy
// address and the first look are not.
func TestNextHopChanges(t *testing.T) {
	web, api := portal.ServiceKey{Namespace: "default", Name: "web"}, portal.ServiceKey{Namespace: "default", Name: "api"}
	lb, cl := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	state := func(local ...string) *State {
		return &State{Targets: []Target{ // sorted by IP, as targets makes them
			{IP: lb, Service: web, Local: true, Nodes: local},
			{IP: lb, Service: api, Local: true, Nodes: local}, // shares it
			{IP: cl, Service: portal.ServiceKey{Namespace: "default", Name: "cluster"}, Nodes: local},
		}}
	}
	changes := func(m map[netip.Addr]HopChange) string { return fmt.Sprint(m) }
	all := func(string) bool { return true }
	now, changed := NextHopChanges(state("node1", "node2"), nil, all)
	if want := map[netip.Addr]string{lb: "node1, node2"}; !maps.Equal(now, want) || len(changed) != 0 {
		t.Fatalf("first look: %v, %v; want %v and no change", now, changed, want)
	}
	now, changed = NextHopChanges(state("node1"), now, all)
	if want := map[netip.Addr]HopChange{lb: {Was: "node1, node2", Svcs: []portal.ServiceKey{web, api}}}; !maps.Equal(now, map[netip.Addr]string{lb: "node1"}) ||
		changes(changed) != changes(want) {
		t.Fatalf("node2's endpoint gone: %v, changed %v; want %v", now, changed, want)
	}
	now, changed = NextHopChanges(state("node1"), now, all)
	if len(changed) != 0 {
		t.Fatalf("nothing changed, yet %v", changed)
	}
	if _, changed = NextHopChanges(state(), now, all); changed[lb].Was != "node1" || len(changed) != 1 {
		t.Fatalf("last endpoint gone: changed %v", changed)
	}
	// node2 loses its BGP peers: it announces nothing, whatever its endpoints.
	if now, _ = NextHopChanges(state("node1", "node2"), nil, func(n string) bool { return n != "node2" }); now[lb] != "node1" {
		t.Fatalf("node2 without peers: next hops %q, want node1", now[lb])
	}
}

// TestHolders: each IP's Services, each once; a pod's IP has none; the
// same with the targets indexed by IP.
func TestHolders(t *testing.T) {
	web, api := portal.ServiceKey{Namespace: "default", Name: "web"}, portal.ServiceKey{Namespace: "default", Name: "api"}
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	s := &State{Targets: []Target{{IP: a, Service: web}, {IP: a, Service: api}, {IP: a, Service: web}, {IP: b, Service: web, Pod: true}, {IP: c, Service: api}}}
	for _, indexed := range []bool{false, true} {
		if indexed {
			s.indexTargets()
		}
		got := map[netip.Addr][]portal.ServiceKey{}
		for _, ip := range []netip.Addr{a, b, c} {
			got[ip] = holders(s, ip)
		}
		if want := (map[netip.Addr][]portal.ServiceKey{a: {web, api}, b: nil, c: {api}}); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("indexed %v: holders = %v, want %v", indexed, got, want)
		}
	}
}
