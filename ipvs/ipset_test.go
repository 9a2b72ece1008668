package ipvs

import (
	"maps"
	"net/netip"
	"os"
	"testing"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// TestIPSets drives the source-range sets against the kernel's ip_set in a
// throwaway namespace (no IPVS needed): a set is created with its
// elements, read back equal, changed by one element with one message, left
// alone when unchanged, filled with thousands of elements in a few
// messages, and destroyed when no longer wanted.
func TestIPSets(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	ns := nsutil.New(t, "ohs-")
	var sets *ipsets
	if err := ns.Do(func() (err error) { sets, err = openIPSets(); return err }); err != nil {
		t.Skipf("no netfilter netlink: %v", err)
	}
	defer sets.close()
	name := rangeSetName("test/web", portal.IPv4)
	want := newPlan()
	want.Sets[name] = rangeSet{Family: portal.IPv4, Nets: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/1"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}}
	want6 := rangeSetName("test/web", portal.IPv6)
	want.Sets[want6] = rangeSet{Family: portal.IPv6, Nets: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}
	apply := func(have, want *plan) int {
		t.Helper()
		n, err := sets.apply(have, want)
		if err != nil {
			if os.Getenv("ONEHOP_VM") == "" && len(have.Sets) == 0 {
				t.Skipf("this kernel cannot create ipsets: %v", err)
			}
			t.Fatal(err)
		}
		return n + sets.destroyStale(have, want)
	}
	read := func() *plan {
		t.Helper()
		pl := newPlan()
		if err := sets.read(pl); err != nil {
			t.Fatal(err)
		}
		return pl
	}
	if n := apply(newPlan(), want); n != 4 {
		t.Errorf("creating two sets of 3 and 1 elements: %d messages, want 4 (a create and an add each)", n)
	}
	got := read()
	if len(got.Sets) != 2 || !got.Sets[name].equal(want.Sets[name]) || !got.Sets[want6].equal(want.Sets[want6]) {
		t.Fatalf("read back %+v, want %+v", got.Sets, want.Sets)
	}
	if n := apply(got, want); n != 0 {
		t.Errorf("an unchanged set: %d messages", n)
	}
	next := newPlan()
	next.Sets[name] = rangeSet{Family: portal.IPv4, Nets: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/1"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("198.51.100.0/24")}}
	if n := apply(read(), next); n != 3 {
		t.Errorf("one element swapped, one set gone: %d messages, want 3", n)
	}
	if got := read(); len(got.Sets) != 1 || !got.Sets[name].equal(next.Sets[name]) {
		t.Errorf("after the change: %+v", got.Sets)
	}
	// Many elements go setBatch to a message.
	big := newPlan()
	for i := range 2500 {
		big.Sets[name] = rangeSet{Family: portal.IPv4, Nets: append(big.Sets[name].Nets, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))}
	}
	if n := apply(read(), big); n != 4 {
		t.Errorf("2500 elements in, 3 out: %d messages, want 3 adds and a delete", n)
	}
	if got := read(); !got.Sets[name].equal(big.Sets[name]) {
		t.Errorf("read back %d elements, want 2500", len(got.Sets[name].Nets))
	}
	if err := sets.destroyAll(); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got.Sets) != 0 {
		t.Errorf("after destroyAll: %+v", got.Sets)
	}
}

// TestFilterSets drives the Service IP filter's sets (filter.go) against
// the kernel's ip_set in a throwaway namespace: created with their
// elements (addresses, and address, protocol and port), read back equal,
// changed element by element, left alone when unchanged, and destroyed by
// destroyAll.
func TestFilterSets(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	ns := nsutil.New(t, "ohf-")
	var sets *ipsets
	if err := ns.Do(func() (err error) { sets, err = openIPSets(); return err }); err != nil {
		t.Skipf("no netfilter netlink: %v", err)
	}
	defer sets.close()
	fams := []portal.Family{portal.IPv4, portal.IPv6}
	read := func() filterState {
		t.Helper()
		pl := newPlan()
		pl.Filter = filterState{Sets: map[string]bool{}, VIPs: map[netip.Addr]bool{}, Ports: map[vsKey]bool{}}
		if err := sets.read(pl); err != nil {
			t.Fatal(err)
		}
		return pl.Filter
	}
	key := func(proto portal.Protocol, ap string) vsKey {
		a := netip.MustParseAddrPort(ap)
		return vsKey{Proto: proto, Addr: a.Addr(), Port: a.Port()}
	}
	want := filterState{
		VIPs: map[netip.Addr]bool{netip.MustParseAddr("10.96.0.1"): true, netip.MustParseAddr("fd00:96::1"): true},
		Ports: map[vsKey]bool{key(portal.TCP, "10.96.0.1:80"): true, key(portal.UDP, "10.96.0.1:53"): true,
			key(portal.SCTP, "10.96.0.1:9999"): true, key(portal.TCP, "[fd00:96::1]:443"): true},
	}
	n, err := sets.applyFilter(read(), want, fams)
	if err != nil {
		if os.Getenv("ONEHOP_VM") == "" {
			t.Skipf("this kernel cannot create the filter's ipsets: %v", err)
		}
		t.Fatal(err)
	}
	if n != 8 {
		t.Errorf("four sets created and filled: %d messages, want 8", n)
	}
	got := read()
	if len(got.Sets) != 4 || !maps.Equal(got.VIPs, want.VIPs) || !maps.Equal(got.Ports, want.Ports) {
		t.Fatalf("read back %+v, want %+v", got, want)
	}
	if n, err := sets.applyFilter(got, want, fams); err != nil || n != 0 {
		t.Errorf("unchanged: %d messages, %v", n, err)
	}
	next := filterState{VIPs: map[netip.Addr]bool{netip.MustParseAddr("10.96.0.1"): true, netip.MustParseAddr("fd00:96::1"): true},
		Ports: maps.Clone(want.Ports)}
	delete(next.Ports, key(portal.UDP, "10.96.0.1:53"))
	next.Ports[key(portal.UDP, "10.96.0.1:5353")] = true
	if n, err := sets.applyFilter(filterOf(&plan{VIPs: want.VIPs, Servers: servers(want.Ports)}, nil), next, fams); err != nil || n != 2 {
		t.Errorf("one port swapped: %d messages (want an add and a delete), %v", n, err)
	}
	if got := read(); !maps.Equal(got.Ports, next.Ports) {
		t.Errorf("after the change: %v, want %v", got.Ports, next.Ports)
	}
	if err := sets.destroyAll(); err != nil {
		t.Fatal(err)
	}
	if got := read(); len(got.Sets) != 0 {
		t.Errorf("after destroyAll: %v", got.Sets)
	}
}

// servers makes a plan's virtual servers (on Service IPs) of keys.
func servers(keys map[vsKey]bool) map[vsKey]*virtualServer {
	out := map[vsKey]*virtualServer{}
	for k := range keys {
		out[k] = &virtualServer{Key: k, Kind: kindClusterIP}
	}
	return out
}
