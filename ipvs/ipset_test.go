package ipvs

import (
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
