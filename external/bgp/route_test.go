package bgp

import (
	"net/netip"
	"strings"
	"testing"
)

// Communities parse in BGPAdvertisement's forms, sorted and without
// repeats; anything else is refused with the form it should have.
func TestParseCommunities(t *testing.T) {
	std, large, err := ParseCommunities([]string{"65000:100", "no-export", "1:2", "large:64512:1:2", "65000:100", "local-as", "large:1:2:3"})
	if err != nil {
		t.Fatal(err)
	}
	r := Route{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Communities: std, LargeCommunities: large}
	if got, want := r.String(), "192.0.2.0/24 communities 1:2,65000:100,no-export,no-export-subconfed,large:1:2:3,large:64512:1:2"; got != want {
		t.Errorf("parsed: %s\nwant    %s", got, want)
	}
	for _, bad := range []string{"65536:1", "1:65536", "a:b", "large:1:2", "large:1:2:4294967296", "no-such", ""} {
		if _, _, err := ParseCommunities([]string{bad}); err == nil || !strings.Contains(err.Error(), "want") {
			t.Errorf("%q: error %v, want one that says what is wanted", bad, err)
		}
	}
}

// Routes of one prefix merge: both communities, the higher LOCAL_PREF;
// merging leaves the route merged from unchanged.
func TestRouteMerge(t *testing.T) {
	lo, hi := uint32(100), uint32(200)
	a := Route{Prefix: netip.MustParsePrefix("192.0.2.0/24"), Communities: []uint32{2}, LocalPref: &lo}
	b := Route{Prefix: a.Prefix, Communities: []uint32{1, 2}, LargeCommunities: []LargeCommunity{{1, 2, 3}}, LocalPref: &hi}
	m := a
	m.Merge(b)
	if got, want := m.String(), "192.0.2.0/24 communities 0:1,0:2,large:1:2:3 localPref 200"; got != want {
		t.Errorf("merged: %s, want %s", got, want)
	}
	if got := a.String(); got != "192.0.2.0/24 communities 0:2 localPref 100" {
		t.Errorf("a changed by the merge: %s", got)
	}
	if !m.Equal(m) || m.Equal(a) || HostRoute(netip.MustParseAddr("::ffff:192.0.2.1")).String() != "192.0.2.1/32" {
		t.Error("Equal or HostRoute wrong")
	}
}
