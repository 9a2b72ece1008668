package external

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/l2"
)

// clockedBeats are heartbeat.Peers on the clock of a clockedLiveness.
type clockedBeats struct {
	p   *heartbeat.Peers
	c   *clockedLiveness
	seq uint64
}

func (b *clockedBeats) Alive(node string) (bool, bool, time.Time) { return b.p.State(node, b.c.clock) }
func (b *clockedBeats) Left(node string) bool                     { return b.p.Left(node) }

func (b *clockedBeats) beat(nodes ...string) {
	for _, n := range nodes {
		b.seq++
		if _, err := b.p.Accept(heartbeat.Message{Node: n, Incarnation: 1, Seq: b.seq}, b.c.clock); err != nil {
			b.c.t.Fatal(err)
		}
	}
}

// TestLivenessHeartbeatsDecide: a node whose heartbeats were taken is
// judged by them, Lease or not, apiserver up or down; a node never heard
// by its Lease; a node heard announcing since its last heartbeat stays
// alive (it still answers: two nodes must not); this node is dead while
// its L2 links are down.
func TestLivenessHeartbeatsDecide(t *testing.T) {
	c := newClockedLiveness(t)
	b := &clockedBeats{p: heartbeat.NewPeers(300 * time.Millisecond), c: c}
	b.p.SetMembers([]string{"b", "c", "d"})
	c.beats = b
	step := 100 * time.Millisecond
	for range 20 {
		c.clock = c.clock.Add(step)
		c.renewed("a", "b", "c", "d")
		b.beat("b", "d")
	}
	c.want("all renewing, b and d beating", map[string]bool{"a": true, "b": true, "c": true, "d": true})

	// b's agent is killed: its Lease would keep it alive for 3 s.
	for range 2 {
		c.clock = c.clock.Add(step)
		c.renewed("a", "c", "d")
		b.beat("d")
	}
	c.want("b silent 200 ms", map[string]bool{"b": true})
	c.clock = c.clock.Add(step)
	c.renewed("a", "c", "d")
	b.beat("d")
	c.want("b silent 300 ms", map[string]bool{"b": false, "c": true, "d": true})

	// The apiserver goes away: the Leases freeze everyone alive, the
	// heartbeats still tell.
	for range 30 {
		c.clock = c.clock.Add(step)
		b.beat("d")
	}
	c.want("apiserver away 3 s, d beating", map[string]bool{"a": true, "c": true, "d": true})
	for range 3 {
		c.clock = c.clock.Add(step)
	}
	c.want("apiserver away, d silent 300 ms", map[string]bool{"c": true, "d": false})

	// d is heard announcing after its last heartbeat: it still answers.
	c.heardFrom("d")
	c.want("d heard since its last heartbeat", map[string]bool{"d": true})
	b.beat("d")
	for range 3 {
		c.clock = c.clock.Add(step)
	}
	c.want("d heard before its last heartbeat, silent since", map[string]bool{"d": false})

	// This node's links go down.
	up := false
	c.linkUp = func() bool { return up }
	c.want("links down", map[string]bool{"a": false})
	up = true
	c.want("links up", map[string]bool{"a": true})
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
		keys, why := readHeartbeatKeys(tc.c)
		var got []string
		for _, k := range keys {
			got = append(got, string(k))
		}
		if strings.Join(got, "|") != tc.keys || (keys == nil) == (why == "") {
			t.Errorf("%+v: keys %q, why %q; want %q", tc.c, got, why, tc.keys)
		}
	}
}
