package bgp

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
)

// TestPeerPrefixLimit: each address family of a peer gets its prefix
// limit, DefaultMaxPrefixes unless the peer sets one.
func TestPeerPrefixLimit(t *testing.T) {
	sp, err := NewSpeaker(Config{ASN: 64513, Peers: []Peer{{Address: "10.0.0.1", ASN: 64512}}},
		[]netip.Addr{netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00::11")}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		set, want uint32
	}{{0, DefaultMaxPrefixes}, {5, 5}} {
		pc := sp.peer(Peer{Address: "10.0.0.1", ASN: 64512, MaxPrefixes: c.set})
		if len(pc.AfiSafis) != 2 {
			t.Fatalf("%d address families, want IPv4 and IPv6", len(pc.AfiSafis))
		}
		for _, af := range pc.AfiSafis {
			l := af.PrefixLimits
			if l == nil || l.MaxPrefixes != c.want || l.Family != af.Config.Family {
				t.Errorf("maxPrefixes %d: %v's limit %v, want %d", c.set, af.Config.Family, l, c.want)
			}
		}
	}
}
