package providers

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/internal/hooktest"
)

// TestBGPPeersPrefixes: every address the speaker announces counts on each
// established session and on none that is down, whichever changes first;
// a peer gone has no series.
func TestBGPPeersPrefixes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := dataplane.NewMetrics(reg)
	series := func() map[string]float64 { t.Helper(); return hooktest.GatherSeries(t, reg, "onehop_bgp_") }
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.3")
	var p BGPPeers
	p.Session(m, bgp.Session{Peer: a})
	p.Session(m, bgp.Session{Peer: b})
	p.SetAnnounced(m, 2)
	p.Session(m, bgp.Session{Peer: a, Up: true})
	want := map[string]float64{
		"onehop_bgp_session_up/10.0.0.1": 1, "onehop_bgp_announced_prefixes_total/10.0.0.1": 2,
		"onehop_bgp_session_up/10.0.0.3": 0, "onehop_bgp_announced_prefixes_total/10.0.0.3": 0,
	}
	if got := series(); !maps.Equal(got, want) {
		t.Fatalf("a up, 2 announced: %v, want %v", got, want)
	}
	p.SetAnnounced(m, 3)
	p.Session(m, bgp.Session{Peer: b, Gone: true})
	want = map[string]float64{"onehop_bgp_session_up/10.0.0.1": 1, "onehop_bgp_announced_prefixes_total/10.0.0.1": 3}
	if got := series(); !maps.Equal(got, want) {
		t.Fatalf("3 announced, b gone: %v, want %v", got, want)
	}
	p.Session(m, bgp.Session{Peer: a, WasUp: true})
	want = map[string]float64{"onehop_bgp_session_up/10.0.0.1": 0, "onehop_bgp_announced_prefixes_total/10.0.0.1": 0}
	if got := series(); !maps.Equal(got, want) {
		t.Fatalf("a down: %v, want %v", got, want)
	}
}
