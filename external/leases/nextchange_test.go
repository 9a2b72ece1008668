package leases_test

import (
	"testing"
	"time"

	"github.com/onehop/onehop/external/internal/fakecluster"
)

// TestLivenessNextChange: the hook sleeps until nextChange. It is the
// moment the node that renewed longest ago would expire; at that moment
// that node is judged dead unless it renewed; while every node renews it
// lies a lease duration minus a renew interval ahead (not a fixed tick);
// and with no other node alive, or the view frozen, nothing can change.
func TestLivenessNextChange(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	if next := c.NextChange(); !next.IsZero() {
		t.Errorf("no other node: nextChange %v, want none", next)
	}
	c.Advance(5*time.Second, time.Second, "a", "b", "c")
	next := c.NextChange()
	if want := c.Clock.Add(3 * time.Second); !next.Equal(want) {
		t.Errorf("b and c renewed just now: nextChange in %v, want 3s", next.Sub(c.Clock))
	}
	// b goes silent; c renews. Wake-ups come at most once per lease
	// duration minus renew interval, and the one at b's expiry sees it dead.
	wakes := 0
	for c.Alive("b") {
		if wakes++; wakes > 10 {
			t.Fatal("b never expired")
		}
		next := c.NextChange()
		if d := next.Sub(c.Clock); d < 2*time.Second-time.Millisecond || d > 3*time.Second {
			t.Errorf("wake %d: nextChange in %v, want between 2s and 3s ahead", wakes, d)
		}
		for c.Clock.Before(next) {
			c.Clock = c.Clock.Add(time.Second)
			if c.Clock.After(next) {
				c.Clock = next
			}
			c.Renewed("a", "c")
		}
	}
	if wakes > 2 {
		t.Errorf("%d wake-ups until b was judged dead 3 s after its last renewal, want at most 2", wakes)
	}
	// The apiserver hangs: the view freezes, nothing can expire.
	c.Clock = c.Clock.Add(10 * time.Second)
	c.Want("frozen", map[string]bool{"c": true})
	if next := c.NextChange(); !next.IsZero() {
		t.Errorf("frozen view: nextChange %v, want none", next)
	}
}
