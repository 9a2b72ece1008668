package bgp

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/api"
)

// A peer with graceful restart advertises it with its restart time (120 s
// unless set), the R and F bits (LocalRestarting) and every family it
// announces, and no N bit; a peer without it advertises nothing of it, as
// before; a restart time over the capability's 12 bits is refused.
func TestPeerGracefulRestart(t *testing.T) {
	sp, err := NewSpeaker(speakerConfig(), []netip.Addr{netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00::11")},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if pc := sp.peer(Peer{Address: "10.0.0.1", ASN: 64512}); pc.GracefulRestart != nil {
		t.Errorf("without graceful restart: %v", pc.GracefulRestart)
	} else {
		for _, af := range pc.AfiSafis {
			if af.MpGracefulRestart != nil {
				t.Errorf("without graceful restart, family %v: %v", af.Config.Family, af.MpGracefulRestart)
			}
		}
	}
	for _, c := range []struct {
		seconds uint16
		want    uint32
	}{{0, 120}, {300, 300}} {
		pc := sp.peer(Peer{Address: "10.0.0.1", ASN: 64512, GracefulRestart: true, GracefulRestartSeconds: c.seconds})
		gr := pc.GracefulRestart
		if gr == nil || !gr.Enabled || gr.RestartTime != c.want || !gr.LocalRestarting || gr.NotificationEnabled || gr.HelperOnly {
			t.Errorf("gracefulRestartSeconds %d: %v, want enabled, restart time %d, restarting, no N bit", c.seconds, gr, c.want)
		}
		if len(pc.AfiSafis) != 2 {
			t.Fatalf("families %v, want IPv4 and IPv6", pc.AfiSafis)
		}
		for _, af := range pc.AfiSafis {
			if m := af.MpGracefulRestart; m == nil || !m.Config.Enabled {
				t.Errorf("family %v: %v, want graceful restart", af.Config.Family, m)
			}
		}
	}

	cfg := speakerConfig()
	cfg.Peers[0].GracefulRestart, cfg.Peers[0].GracefulRestartSeconds = true, 4096
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "4095") {
		t.Errorf("restart time 4096: %v, want an error naming 4095", err)
	}
	cfg.Peers[0].GracefulRestartSeconds = 4095
	if err := cfg.Validate(); err != nil {
		t.Errorf("restart time 4095: %v", err)
	}
}

// A peer with graceful restart reaches GoBGP only once the speaker is
// Ready (its End-of-RIB must follow every route the node serves), whether
// it was configured at Start or added later; one changed or deleted while
// held is changed or forgotten; the peers without it are added at once.
// StopForRestart stops the speaker without an error. The peers are closed
// ports on loopback: no session comes up.
func TestSpeakerHoldsGracefulPeersUntilReady(t *testing.T) {
	plain := Peer{Address: "127.0.0.1", Port: 1, ASN: 64512}
	graceful := Peer{Address: "127.0.0.3", Port: 1, ASN: 64512, GracefulRestart: true}
	cfg := Config{ASN: 64513, RouterID: "127.0.0.2", Peers: []Peer{plain, graceful}}
	sp, err := NewSpeaker(cfg, []netip.Addr{netip.MustParseAddr("127.0.0.2")}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	inGoBGP := func() map[string]uint32 { // address -> restart time advertised
		t.Helper()
		got := map[string]uint32{}
		if err := sp.srv.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
			got[p.Conf.NeighborAddress] = p.GetGracefulRestart().GetRestartTime()
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	check := func(what string, want map[string]uint32) {
		t.Helper()
		if got := inGoBGP(); !maps.Equal(got, want) {
			t.Errorf("%s: GoBGP's peers %v, want %v", what, got, want)
		}
	}
	check("started", map[string]uint32{"127.0.0.1": 0})

	longer := graceful
	longer.GracefulRestartSeconds = 300
	later := Peer{Address: "127.0.0.4", Port: 1, ASN: 64512, GracefulRestart: true}
	if err := sp.SetPeers(ctx, []Peer{plain, longer, later}); err != nil {
		t.Fatal(err)
	}
	check("graceful peers changed and added before Ready", map[string]uint32{"127.0.0.1": 0})
	if err := sp.SetPeers(ctx, []Peer{plain, longer}); err != nil {
		t.Fatal(err)
	}
	if err := sp.SetRoutes([]Route{HostRoute(netip.MustParseAddr("203.0.113.10"))}); err != nil {
		t.Fatal(err)
	}
	if err := sp.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	check("Ready", map[string]uint32{"127.0.0.1": 0, "127.0.0.3": 300})
	if err := sp.SetPeers(ctx, []Peer{plain, longer, later}); err != nil {
		t.Fatal(err)
	}
	check("graceful peer added after Ready", map[string]uint32{"127.0.0.1": 0, "127.0.0.3": 300, "127.0.0.4": 120})
	if err := sp.Ready(ctx); err != nil {
		t.Errorf("Ready again: %v", err)
	}
	if err := sp.StopForRestart(ctx); err != nil {
		t.Errorf("StopForRestart: %v", err)
	}
	if got := sp.Announced(); !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("203.0.113.10/32")}) {
		t.Errorf("announced after StopForRestart %v: nothing is withdrawn", got)
	}
}

func speakerConfig() Config {
	return Config{ASN: 64513, Peers: []Peer{{Address: "10.0.0.1", ASN: 64512}}}
}
