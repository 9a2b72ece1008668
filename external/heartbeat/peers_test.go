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

// TestPeersRestartHold: a peer that says it restarts stays alive for the
// hold while its node answers echo requests, each within the timeout of
// the one before; it is dead once they stop or the hold ends, and alive
// as usual once its new incarnation beats. Without a hold, restarting is
// leaving.
func TestPeersRestartHold(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	restart := func(p *Peers, seq uint64, ms int) {
		t.Helper()
		if _, err := p.Accept(Message{Node: "b", Incarnation: 1, Seq: seq, Restarting: true}, at(ms)); err != nil {
			t.Fatal(err)
		}
	}
	start := func() *Peers {
		p := NewPeers(300 * time.Millisecond)
		p.SetRestartHold(2 * time.Second)
		p.SetMembers([]string{"b"})
		if _, err := p.Accept(Message{Node: "b", Incarnation: 1, Seq: 1}, at(0)); err != nil {
			t.Fatal(err)
		}
		restart(p, 2, 100) // held until 2100 ms
		return p
	}
	alive := func(p *Peers, ms int) bool { a, _, _ := p.State("b", at(ms)); return a }

	// Its node answers every 100 ms: alive to the end of the hold, then
	// dead, whatever the echoes say.
	p := start()
	if got := p.Held(at(100)); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Held after the restart: %v", got)
	}
	for ms := 200; ms < 2100; ms += 100 {
		p.Echoed("b", at(ms))
		if !alive(p, ms+50) || len(p.Expire(at(ms+50))) > 0 {
			t.Fatalf("held, echoed at %d ms: dead at %d ms", ms, ms+50)
		}
	}
	if alive(p, 2100) || !slices.Equal(p.Expire(at(2100)), []string{"b"}) {
		t.Error("the hold over, no heartbeat: alive, or not expired")
	}
	if len(p.Held(at(2100))) > 0 {
		t.Error("the hold over: still held")
	}

	// Its node stops answering at 500 ms: dead at 800 ms.
	p = start()
	for ms := 200; ms <= 500; ms += 100 {
		p.Echoed("b", at(ms))
	}
	if !alive(p, 799) || alive(p, 800) || !slices.Equal(p.Expire(at(800)), []string{"b"}) {
		t.Error("echoes stopped at 500 ms: want alive at 799 ms, dead and expired at 800 ms")
	}
	// An echo after it was found dead brings nothing back.
	p.Echoed("b", at(900))
	if alive(p, 950) || len(p.Held(at(950))) > 0 {
		t.Error("echoed after it was found dead: alive or held again")
	}

	// No echo at all: dead a timeout after the datagram that said so.
	p = start()
	if !alive(p, 399) || alive(p, 400) {
		t.Error("held, no echo: want dead 300 ms after the restart datagram")
	}

	// The new incarnation beats: alive as usual, no longer held, and no
	// change reported (it never died).
	p = start()
	p.Echoed("b", at(300))
	if changed, err := p.Accept(Message{Node: "b", Incarnation: 2, Seq: 1}, at(400)); err != nil || changed {
		t.Errorf("back while held: changed %v, %v; want no change", changed, err)
	}
	if len(p.Held(at(400))) > 0 || !alive(p, 699) || alive(p, 700) {
		t.Error("back: want no longer held, alive for a timeout after its heartbeat")
	}

	// Echoes from a peer not held keep nothing alive.
	p = start()
	if _, err := p.Accept(Message{Node: "b", Incarnation: 1, Seq: 3}, at(150)); err != nil {
		t.Fatal(err)
	}
	p.Echoed("b", at(400))
	if alive(p, 460) {
		t.Error("not held (a heartbeat after the restart datagram), echoed: alive past its timeout")
	}

	// Without a hold, restarting is leaving.
	q := NewPeers(300 * time.Millisecond)
	q.SetMembers([]string{"b"})
	if _, err := q.Accept(Message{Node: "b", Incarnation: 1, Seq: 1}, at(0)); err != nil {
		t.Fatal(err)
	}
	restart(q, 2, 100)
	if alive(q, 100) || !q.Left("b") {
		t.Error("no hold, restarting: want dead and left at once")
	}
}
