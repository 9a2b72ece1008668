package l2

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestPeriodicSchedule: on a fake clock, each round waits the interval
// plus or minus at most the jitter, drawn afresh each time, and announces
// every IP owned at that moment; nothing after done. No jitter: the
// interval exactly.
func TestPeriodicSchedule(t *testing.T) {
	draws := []float64{0, 0.5, 0.999, 0.25}
	i := 0
	p := periodic{every: 10 * time.Second, jitter: time.Second, rnd: func() float64 { d := draws[i%len(draws)]; i++; return d }}
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	owned := [][]netip.Addr{{a}, {a, b}, {}, {b}}
	done := make(chan struct{})
	var waits []time.Duration
	var rounds [][]netip.Addr
	now := time.Unix(0, 0)
	after := func(d time.Duration) <-chan time.Time {
		waits = append(waits, d)
		ch := make(chan time.Time, 1)
		if len(waits) > len(owned) {
			close(done) // the responder closes while waiting
			return ch
		}
		now = now.Add(d)
		ch <- now
		rounds = append(rounds, nil)
		return ch
	}
	round := 0
	p.run(done, after, func() []netip.Addr { r := owned[round]; round++; return r }, func(ip netip.Addr) {
		rounds[len(rounds)-1] = append(rounds[len(rounds)-1], ip)
	})
	wantWaits := []time.Duration{9 * time.Second, 10 * time.Second, 10*time.Second + 998*time.Millisecond, 9500 * time.Millisecond, 9 * time.Second}
	for k, w := range waits {
		if w < p.every-p.jitter || w > p.every+p.jitter {
			t.Errorf("wait %d: %v, outside %v ± %v", k, w, p.every, p.jitter)
		}
		if d := w - wantWaits[k]; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("wait %d: %v, want %v", k, w, wantWaits[k])
		}
	}
	if len(rounds) != len(owned) {
		t.Fatalf("%d rounds, want %d", len(rounds), len(owned))
	}
	for k := range owned {
		if !slices.Equal(rounds[k], owned[k]) {
			t.Errorf("round %d announced %v, want %v", k, rounds[k], owned[k])
		}
	}
	if (periodic{every: time.Second}).next() != time.Second {
		t.Error("no jitter: not the interval")
	}
}
