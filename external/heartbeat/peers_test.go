package heartbeat

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestPeersReplay(t *testing.T) {
	p := NewPeers(300 * time.Millisecond)
	p.SetMembers([]string{"b"})
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	steps := []struct {
		m       Message
		ms      int
		err     error
		changed bool
	}{
		{Message{Node: "b", Incarnation: 5, Seq: 10}, 0, nil, true},
		{Message{Node: "b", Incarnation: 5, Seq: 11}, 100, nil, false},
		{Message{Node: "b", Incarnation: 5, Seq: 11}, 150, ErrReplay, false}, // the same again
		{Message{Node: "b", Incarnation: 5, Seq: 3}, 160, ErrReplay, false},  // an old one
		{Message{Node: "b", Incarnation: 4, Seq: 99}, 170, ErrReplay, false}, // an older incarnation
		{Message{Node: "b", Incarnation: 6, Seq: 1}, 200, nil, false},        // restarted: counts from 1
		{Message{Node: "b", Incarnation: 5, Seq: 12}, 210, ErrReplay, false}, // the last incarnation is over
		{Message{Node: "c", Incarnation: 1, Seq: 1}, 220, ErrNotPeer, false},
	}
	for i, s := range steps {
		changed, err := p.Accept(s.m, at(s.ms))
		if !errors.Is(err, s.err) || (err == nil && changed != s.changed) {
			t.Fatalf("step %d %+v: changed %v, %v; want %v, %v", i, s.m, changed, err, s.changed, s.err)
		}
	}
	// A datagram under another key from b's address: b's heartbeats
	// decide nothing, yet nothing older than what was taken is taken.
	if !p.Unverified("b") || p.Unverified("b") {
		t.Error("Unverified: want true once, for a peer heard")
	}
	if _, known, _ := p.State("b", at(230)); known {
		t.Error("b unverified: known")
	}
	if _, err := p.Accept(Message{Node: "b", Incarnation: 6, Seq: 1}, at(240)); !errors.Is(err, ErrReplay) {
		t.Errorf("b unverified, an old datagram: %v, want ErrReplay", err)
	}
	if changed, err := p.Accept(Message{Node: "b", Incarnation: 6, Seq: 2}, at(250)); err != nil || !changed {
		t.Errorf("b heard again: changed %v, %v", changed, err)
	}
	// A replayed datagram does not keep a peer alive.
	if alive, _, last := p.State("b", at(549)); !alive || !last.Equal(at(250)) {
		t.Errorf("b at 549 ms: alive %v, last %v; want alive since 250 ms", alive, last)
	}
	if alive, _, _ := p.State("b", at(550)); alive {
		t.Error("b at 550 ms, 300 ms after the last datagram taken: alive")
	}
}

func TestPeersMissCounting(t *testing.T) {
	p := NewPeers(3 * 100 * time.Millisecond)
	p.SetMembers([]string{"b", "c"})
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	if alive, known, _ := p.State("b", t0); alive || known {
		t.Fatalf("b never heard: alive %v, known %v; want neither (the Lease judges it)", alive, known)
	}
	seq := uint64(0)
	beat := func(n string, ms int) {
		seq++
		if _, err := p.Accept(Message{Node: n, Incarnation: 1, Seq: seq}, at(ms)); err != nil {
			t.Fatal(err)
		}
	}
	for ms := 0; ms <= 500; ms += 100 {
		beat("b", ms)
		beat("c", ms)
	}
	// b stops after 500 ms; c goes on.
	for ms := 600; ms <= 1000; ms += 100 {
		beat("c", ms)
	}
	for _, s := range []struct {
		ms   int
		dead []string
	}{{600, nil}, {700, nil}, {799, nil}, {800, []string{"b"}}, {900, nil}} {
		if got := p.Expire(at(s.ms)); !slices.Equal(got, s.dead) {
			t.Errorf("Expire at %d ms (b's last at 500): %v, want %v", s.ms, got, s.dead)
		}
	}
	if alive, known, _ := p.State("b", at(900)); alive || !known {
		t.Errorf("b after missing 3: alive %v, known %v; want dead and known", alive, known)
	}
	if alive, _, _ := p.State("c", at(1000)); !alive {
		t.Error("c beating: dead")
	}
	// b's agent starts again: alive at once.
	if changed, err := p.Accept(Message{Node: "b", Incarnation: 2, Seq: 1}, at(1000)); err != nil || !changed {
		t.Errorf("b's new incarnation: changed %v, %v; want it alive again", changed, err)
	}
	// A peer that says it leaves is dead at once.
	if changed, err := p.Accept(Message{Node: "c", Incarnation: 1, Seq: seq + 1, Leaving: true}, at(1010)); err != nil || !changed {
		t.Errorf("c leaving: changed %v, %v", changed, err)
	}
	if alive, _, last := p.State("c", at(1010)); alive || !p.Left("c") || !last.Equal(at(1010)) {
		t.Errorf("c left: alive %v, Left %v, last %v; want dead, left at 1010 ms", alive, p.Left("c"), last)
	}
	if p.Left("b") {
		t.Error("b, which missed its heartbeats and came back, Left")
	}
	if got := p.Expire(at(2000)); !slices.Equal(got, []string{"b"}) {
		t.Errorf("Expire at 2 s: %v, want only b (c was reported when it left)", got)
	}
	// A node no longer a member is forgotten; when it is again, it is
	// not known until heard.
	p.SetMembers([]string{"c"})
	p.SetMembers([]string{"b", "c"})
	if _, known, _ := p.State("b", at(2000)); known {
		t.Error("b a member again: known before it is heard")
	}
}
