package leases_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/internal/fakecluster"
	"github.com/onehop/onehop/external/internal/hooktest"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/leases"
)

// clockedBeats are heartbeat.Peers on the clock of a clockedLiveness.
type clockedBeats struct {
	p   *heartbeat.Peers
	c   *fakecluster.Clocked
	seq uint64
}

func (b *clockedBeats) Alive(node string) (bool, bool, time.Time) { return b.p.State(node, b.c.Clock) }
func (b *clockedBeats) Left(node string) bool                     { return b.p.Left(node) }

func (b *clockedBeats) beat(nodes ...string) {
	for _, n := range nodes {
		b.seq++
		if _, err := b.p.Accept(heartbeat.Message{Node: n, Incarnation: 1, Seq: b.seq}, b.c.Clock); err != nil {
			b.c.T.Fatal(err)
		}
	}
}

// TestLivenessHeartbeatsDecide: a node whose heartbeats were taken is
// judged by them, Lease or not, apiserver up or down; a node never heard
// by its Lease; a node heard announcing since its last heartbeat stays
// alive (it still answers: two nodes must not); this node is dead while
// its L2 links are down.
func TestLivenessHeartbeatsDecide(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	b := &clockedBeats{p: heartbeat.NewPeers(300 * time.Millisecond), c: c}
	b.p.SetMembers([]string{"b", "c", "d"})
	c.SetHeartbeats(b, nil)
	step := 100 * time.Millisecond
	for range 20 {
		c.Clock = c.Clock.Add(step)
		c.Renewed("a", "b", "c", "d")
		b.beat("b", "d")
	}
	c.Want("all renewing, b and d beating", map[string]bool{"a": true, "b": true, "c": true, "d": true})

	// b's agent is killed: its Lease would keep it alive for 3 s.
	for range 2 {
		c.Clock = c.Clock.Add(step)
		c.Renewed("a", "c", "d")
		b.beat("d")
	}
	c.Want("b silent 200 ms", map[string]bool{"b": true})
	c.Clock = c.Clock.Add(step)
	c.Renewed("a", "c", "d")
	b.beat("d")
	c.Want("b silent 300 ms", map[string]bool{"b": false, "c": true, "d": true})

	// The apiserver goes away: the Leases freeze everyone alive, the
	// heartbeats still tell.
	for range 30 {
		c.Clock = c.Clock.Add(step)
		b.beat("d")
	}
	c.Want("apiserver away 3 s, d beating", map[string]bool{"a": true, "c": true, "d": true})
	for range 3 {
		c.Clock = c.Clock.Add(step)
	}
	c.Want("apiserver away, d silent 300 ms", map[string]bool{"c": true, "d": false})

	// d is heard announcing after its last heartbeat: it still answers.
	c.HeardFrom("d")
	c.Want("d heard since its last heartbeat", map[string]bool{"d": true})
	b.beat("d")
	for range 3 {
		c.Clock = c.Clock.Add(step)
	}
	c.Want("d heard before its last heartbeat, silent since", map[string]bool{"d": false})

	// This node's links go down.
	up := false
	c.SetLinkUp(func() bool { return up })
	c.Want("links down", map[string]bool{"a": false})
	up = true
	c.Want("links up", map[string]bool{"a": true})
}

func TestReadHeartbeatKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		c    *l2.HeartbeatConfig
		keys string
	}{
		{&l2.HeartbeatConfig{KeyFile: filepath.Join(dir, "missing")}, ""},
		{&l2.HeartbeatConfig{KeyFile: write("empty", "\n \n")}, ""},
		{&l2.HeartbeatConfig{KeyFile: write("short", "0123456789\n")}, ""},
		{&l2.HeartbeatConfig{KeyFile: write("one short", "0123456789abcdef0123\nshort\n")}, ""},
		{&l2.HeartbeatConfig{KeyFile: write("ok", " 0123456789abcdef0123\n")}, "0123456789abcdef0123"},
		{&l2.HeartbeatConfig{KeyFile: write("two", "new key, 16 bytes or more\n\nold key, 16 bytes or more\n")}, "new key, 16 bytes or more|old key, 16 bytes or more"},
	} {
		keys, why := leases.ReadHeartbeatKeys(tc.c)
		var got []string
		for _, k := range keys {
			got = append(got, string(k))
		}
		if strings.Join(got, "|") != tc.keys || (keys == nil) == (why == "") {
			t.Errorf("%+v: keys %q, why %q; want %q", tc.c, got, why, tc.keys)
		}
	}
}

// TestHeartbeatMetrics: no series while heartbeats are off; with them, the
// peers by state and every refusal reason, from the heartbeats' own
// counts; registered again on the same registry, the first stays.
func TestHeartbeatMetrics(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	var beats *heartbeat.Heartbeat
	leases.RegisterHeartbeatMetrics(reg, func() *heartbeat.Heartbeat {
		mu.Lock()
		defer mu.Unlock()
		return beats
	}, log)
	leases.RegisterHeartbeatMetrics(reg, func() *heartbeat.Heartbeat { return nil }, log)
	series := func() map[string]float64 { t.Helper(); return hooktest.GatherSeries(t, reg, "onehop_l2_") }
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
	mu.Lock()
	beats = hb
	mu.Unlock()
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
