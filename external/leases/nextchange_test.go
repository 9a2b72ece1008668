package external

import (
	"testing"
	"time"
)

// TestLivenessNextChange: the hook sleeps until nextChange. It is the
// moment the node that renewed longest ago would expire; at that moment
// that node is judged dead unless it renewed; while every node renews it
// lies a lease duration minus a renew interval ahead (not a fixed tick);
// and with no other node alive, or the view frozen, nothing can change.
func TestLivenessNextChange(t *testing.T) {
	c := newClockedLiveness(t)
	if next := c.nextChange(); !next.IsZero() {
		t.Errorf("no other node: nextChange %v, want none", next)
	}
	c.advance(5*time.Second, time.Second, "a", "b", "c")
	next := c.nextChange()
	if want := c.clock.Add(3 * time.Second); !next.Equal(want) {
		t.Errorf("b and c renewed just now: nextChange in %v, want 3s", next.Sub(c.clock))
	}
	// b goes silent; c renews. Wake-ups come at most once per lease
	// duration minus renew interval, and the one at b's expiry sees it dead.
	wakes := 0
	for c.alive("b") {
		if wakes++; wakes > 10 {
			t.Fatal("b never expired")
		}
		next := c.nextChange()
		if d := next.Sub(c.clock); d < 2*time.Second-time.Millisecond || d > 3*time.Second {
			t.Errorf("wake %d: nextChange in %v, want between 2s and 3s ahead", wakes, d)
		}
		for c.clock.Before(next) {
			c.clock = c.clock.Add(time.Second)
			if c.clock.After(next) {
				c.clock = next
			}
			c.renewed("a", "c")
		}
	}
	if wakes > 2 {
		t.Errorf("%d wake-ups until b was judged dead 3 s after its last renewal, want at most 2", wakes)
	}
	// The apiserver hangs: the view freezes, nothing can expire.
	c.clock = c.clock.Add(10 * time.Second)
	c.want("frozen", map[string]bool{"c": true})
	if next := c.nextChange(); !next.IsZero() {
		t.Errorf("frozen view: nextChange %v, want none", next)
	}
}
