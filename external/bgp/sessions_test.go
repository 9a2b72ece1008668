package bgp

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestSessionsReportChangesOnly: of GoBGP's peer events only a peer's
// first sight, a session established, one that leaves that state and a
// peer that goes away are reported; the attempts of a session that cannot
// come up, and events after the speaker stopped, are not.
func TestSessionsReportChangesOnly(t *testing.T) {
	var got []Session
	s := &sessions{fn: func(x Session) { got = append(got, x) }}
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.3")

	s.observe(a, 64512, false, true, "") // Idle at AddPeer: first sight
	s.observe(a, 64512, false, true, "") // Active
	s.observe(a, 64512, false, true, "") // OpenSent
	s.observe(a, 64512, true, true, "")
	s.observe(a, 64512, true, true, "") // a repeated Established (INIT after STATE)
	s.observe(a, 64512, false, true, "hold timer expired")
	for range 5 { // a wrong password: Connect, Active, Idle, ... never up
		s.observe(a, 64512, false, true, "")
	}
	s.observe(a, 64512, true, true, "")
	s.observe(b, 64512, false, false, "") // not (or no longer) configured, never seen: nothing
	s.observe(b, 64512, true, true, "")
	s.observe(b, 64512, false, false, "") // removed while up
	s.observe(b, 64512, false, false, "")
	s.close()
	s.observe(a, 64512, false, true, "") // after Stop: nothing
	s.close()

	want := []Session{
		{Peer: a, ASN: 64512},
		{Peer: a, ASN: 64512, Up: true},
		{Peer: a, ASN: 64512, WasUp: true, Reason: "hold timer expired"},
		{Peer: a, ASN: 64512, Up: true},
		{Peer: b, ASN: 64512, Up: true},
		{Peer: b, ASN: 64512, WasUp: true, Gone: true, Reason: "peer no longer configured"},
		{Peer: a, ASN: 64512, WasUp: true, Gone: true, Reason: "speaker stopped"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("reports:\n got %+v\nwant %+v", got, want)
	}
}

// TestSpeakerRestartLeavesNoWatch: a speaker started and stopped again
// and again (as a reload does) reports its peer gone at each stop and
// leaves no goroutine behind: its watch of GoBGP's events ends with it.
func TestSpeakerRestartLeavesNoWatch(t *testing.T) {
	cfg := Config{ASN: 64513, RouterID: "127.0.0.2", Peers: []Peer{{Address: "127.0.0.1", Port: 1, ASN: 64512}}}
	run := func() []Session {
		sp, err := NewSpeaker(cfg, []netip.Addr{netip.MustParseAddr("127.0.0.2")}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var got []Session
		sp.OnSession(func(s Session) { mu.Lock(); got = append(got, s); mu.Unlock() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sp.Start(ctx); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			n := len(got)
			mu.Unlock()
			if n > 0 || time.Now().After(deadline) {
				break
			}
		}
		if err := sp.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	run() // GoBGP's package-level goroutines, if any, start here
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	for range 5 {
		got := run()
		peer := netip.MustParseAddr("127.0.0.1")
		want := []Session{{Peer: peer, ASN: 64512}, {Peer: peer, ASN: 64512, Gone: true, Reason: "speaker stopped"}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("reports of one run:\n got %+v\nwant %+v", got, want)
		}
	}
	var after int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if after = runtime.NumGoroutine(); after <= before || time.Now().After(deadline) {
			break
		}
	}
	if after > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after 5 restarts, %d before:\n%s", after, before, buf[:runtime.Stack(buf, true)])
	}
}
