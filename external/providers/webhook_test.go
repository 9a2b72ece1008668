package external

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

// TestWebhookAnnounced: onehop_announced_ips of the webhook is the number
// of distinct IPs the leader last sent (two Services sharing one count it
// once), and 0 when it does not lead.
func TestWebhookAnnounced(t *testing.T) {
	n, err := webhook.New(webhook.Config{URL: "https://127.0.0.1:1/hook", Secret: "s3cret"}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := portal.ServiceKey{Namespace: "default", Name: "a"}, portal.ServiceKey{Namespace: "default", Name: "b"}
	ip1, ip2 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	st := &State{Leader: true, Targets: []Target{{IP: ip1, Service: a}, {IP: ip1, Service: b}, {IP: ip2, Service: b}}}
	p := &webhookProvider{n: n}
	if err := p.Update(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if got := p.announced(); got != 2 {
		t.Errorf("leader sending 2 IPs of 2 Services: announced %d, want 2", got)
	}
	st.Leader = false
	if err := p.Update(t.Context(), st); err != nil {
		t.Fatal(err)
	}
	if got := p.announced(); got != 0 {
		t.Errorf("not leading: announced %d, want 0", got)
	}
}

// TestPoolAddresses: a pool's total is its used and free addresses, capped
// at the largest int64 (an IPv6 /64 has more).
func TestPoolAddresses(t *testing.T) {
	got := poolAddresses(map[string][2]int64{"main": {1, 2}, "v6": {3, math.MaxInt64}, "empty": {0, 0}})
	want := map[string]dataplane.PoolAddresses{"main": {InUse: 1, Total: 3}, "v6": {InUse: 3, Total: math.MaxInt64}, "empty": {}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("poolAddresses = %v, want %v", got, want)
	}
}

// TestWebhookOutcome: a request nothing answered (the HTTP client's own
// error) is unreachable; an answer other than 2xx is rejected.
func TestWebhookOutcome(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now
	_, err = http.Get("http://" + addr + "/")
	if err == nil {
		t.Fatal("a closed port answered")
	}
	if got := webhookOutcome(fmt.Errorf("attempt 3: %w", err)); got != dataplane.WebhookUnreachable {
		t.Errorf("connection refused: %s, want %s", got, dataplane.WebhookUnreachable)
	}
	if got := webhookOutcome(errors.New("webhook https://hook.example answered 503 Service Unavailable")); got != dataplane.WebhookRejected {
		t.Errorf("a 503 answer: %s, want %s", got, dataplane.WebhookRejected)
	}
}

// TestBGPPeersPrefixes: every address the speaker announces counts on each
// established session and on none that is down, whichever changes first;
// a peer gone has no series.
func TestBGPPeersPrefixes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := dataplane.NewMetrics(reg)
	series := func() map[string]float64 { t.Helper(); return gatherSeries(t, reg, "onehop_bgp_") }
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.3")
	var p bgpPeers
	p.session(m, bgp.Session{Peer: a})
	p.session(m, bgp.Session{Peer: b})
	p.setAnnounced(m, 2)
	p.session(m, bgp.Session{Peer: a, Up: true})
	want := map[string]float64{
		"onehop_bgp_session_up/10.0.0.1": 1, "onehop_bgp_announced_prefixes_total/10.0.0.1": 2,
		"onehop_bgp_session_up/10.0.0.3": 0, "onehop_bgp_announced_prefixes_total/10.0.0.3": 0,
	}
	if got := series(); !maps.Equal(got, want) {
		t.Fatalf("a up, 2 announced: %v, want %v", got, want)
	}
	p.setAnnounced(m, 3)
	p.session(m, bgp.Session{Peer: b, Gone: true})
	want = map[string]float64{"onehop_bgp_session_up/10.0.0.1": 1, "onehop_bgp_announced_prefixes_total/10.0.0.1": 3}
	if got := series(); !maps.Equal(got, want) {
		t.Fatalf("3 announced, b gone: %v, want %v", got, want)
	}
	p.session(m, bgp.Session{Peer: a, WasUp: true})
	want = map[string]float64{"onehop_bgp_session_up/10.0.0.1": 0, "onehop_bgp_announced_prefixes_total/10.0.0.1": 0}
	if got := series(); !maps.Equal(got, want) {
		t.Fatalf("a down: %v, want %v", got, want)
	}
}

// TestHeartbeatMetrics: no series while heartbeats are off; with them, the
// peers by state and every refusal reason, from the heartbeats' own
// counts; a hook built again on the same registry keeps the first.
func TestHeartbeatMetrics(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	h := &Hook{log: log, registerer: reg}
	h.registerMetrics()
	(&Hook{log: log, registerer: reg}).registerMetrics()
	series := func() map[string]float64 { t.Helper(); return gatherSeries(t, reg, "onehop_l2_") }
	if got := series(); len(got) != 0 {
		t.Errorf("heartbeats off: %v, want no series", got)
	}
	hb, err := heartbeat.Listen(heartbeat.Config{Node: "a", Key: []byte("a key for the test only"), Bind: netip.MustParseAddrPort("127.0.0.1:0")}, log, func() {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // closes its socket
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		hb.Run(ctx)
	})
	hb.SetPeers(map[string]netip.Addr{"b": netip.MustParseAddr("127.0.0.2"), "c": netip.MustParseAddr("127.0.0.3")})
	h.mu.Lock()
	h.beats = hb
	h.mu.Unlock()
	got := series()
	want := map[string]float64{
		"onehop_l2_heartbeat_peers/alive": 0, "onehop_l2_heartbeat_peers/dead": 0, "onehop_l2_heartbeat_peers/unheard": 2,
		"onehop_l2_heartbeats_received_total": 0,
	}
	for _, r := range []string{"bad_mac", "replay", "wrong_source", "not_peer", "malformed"} {
		want["onehop_l2_heartbeats_refused_total/"+r] = 0
	}
	if !maps.Equal(got, want) {
		t.Errorf("heartbeats on, two peers never heard:\n got %v\nwant %v", got, want)
	}
}

// gatherSeries is reg's series whose names begin with prefix, each as its
// name, then "/" and its one label's value if it has one, to its value.
func gatherSeries(t *testing.T, reg *prometheus.Registry, prefix string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, mt := range mf.GetMetric() {
			name := mf.GetName()
			if l := mt.GetLabel(); len(l) > 0 {
				name += "/" + l[0].GetValue()
			}
			out[name] = mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
		}
	}
	return out
}
