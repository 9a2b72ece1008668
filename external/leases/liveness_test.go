package external

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// clockedLiveness is a liveness of node "a" (renew 1 s, duration 3 s) on a
// hand-driven clock, already renewed once, with its Leases listed.
type clockedLiveness struct {
	*liveness
	t       *testing.T
	clock   time.Time
	rv      map[string]int
	resumes int
	// changes counts the hook's wake-ups (changed).
	changes int
}

func newClockedLiveness(t *testing.T) *clockedLiveness {
	c := &clockedLiveness{t: t, clock: time.Unix(1_000_000, 0), rv: map[string]int{}}
	c.liveness = newLiveness(nil, "default", "a", time.Second, 3*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)), func() { c.changes++ })
	c.liveness.now = func() time.Time { return c.clock }
	c.liveness.resumed = func() { c.resumes++ }
	c.ownRenew = c.clock
	return c
}

// renewed: node's Lease changed and the watch delivered it now.
func (c *clockedLiveness) renewed(nodes ...string) {
	for _, n := range nodes {
		c.rv[n]++
		rt := metav1.NewMicroTime(c.clock)
		c.observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leasePrefix + n, ResourceVersion: strconv.Itoa(c.rv[n])},
			Spec: coordinationv1.LeaseSpec{RenewTime: &rt}})
	}
}

// advance moves the clock in steps of step, renewing the given nodes'
// Leases (through the watch) at each step.
func (c *clockedLiveness) advance(d, step time.Duration, renewing ...string) {
	for end := c.clock.Add(d); c.clock.Before(end); {
		c.clock = c.clock.Add(step)
		c.renewed(renewing...)
	}
}

func (c *clockedLiveness) want(what string, alive map[string]bool) {
	c.t.Helper()
	for n, w := range alive {
		if got := c.alive(n); got != w {
			c.t.Errorf("%s: alive(%s) = %v, want %v", what, n, got, w)
		}
	}
}

func TestLivenessNodeDiesWhileInContact(t *testing.T) {
	c := newClockedLiveness(t)
	c.advance(5*time.Second, time.Second, "a", "b", "c")
	c.want("all renewing", map[string]bool{"a": true, "b": true, "c": true})
	c.advance(2500*time.Millisecond, 500*time.Millisecond, "a", "c")
	c.want("b silent 2.5 s", map[string]bool{"a": true, "b": true, "c": true})
	c.advance(time.Second, 500*time.Millisecond, "a", "c")
	c.want("b silent 3.5 s", map[string]bool{"a": true, "b": false, "c": true})
	if c.resumes != 0 {
		t.Errorf("resumed %d times without an outage", c.resumes)
	}
}

// TestLivenessNodeBack: a node whose agent crashed leaves its Lease
// behind; when a new agent renews it, the node is alive again and the
// hook is woken at once (the node that took its IPs over must give them
// back), whether the Lease was seen alive before or was already stale when
// first listed. Renewals of a node alive anyway wake nothing.
func TestLivenessNodeBack(t *testing.T) {
	c := newClockedLiveness(t)
	c.advance(5*time.Second, time.Second, "a", "b")
	c.changes = 0
	c.advance(5*time.Second, time.Second, "a", "b")
	if c.changes != 0 {
		t.Errorf("renewals of live nodes woke the hook %d times", c.changes)
	}
	c.advance(4*time.Second, time.Second, "a") // b's agent crashed
	c.want("b's agent dead", map[string]bool{"b": false})
	c.changes = 0
	c.clock = c.clock.Add(300 * time.Millisecond)
	c.renewed("b") // its new agent's first renewal
	c.want("b's agent started again", map[string]bool{"b": true})
	if c.changes != 1 {
		t.Errorf("b back: the hook was woken %d times, want 1", c.changes)
	}

	// c's Lease is stale when first listed (its agent died long ago).
	stale := metav1.NewMicroTime(c.clock.Add(-time.Minute))
	c.observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leasePrefix + "c", ResourceVersion: "stale"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &stale}})
	c.want("c listed stale", map[string]bool{"c": false})
	c.changes = 0
	c.clock = c.clock.Add(time.Second)
	c.renewed("c")
	c.want("c's agent started", map[string]bool{"c": true})
	if c.changes != 1 {
		t.Errorf("c back: the hook was woken %d times, want 1", c.changes)
	}
}

// TestLivenessOutage: the apiserver hangs (no Lease changes reach anyone);
// the view freezes for any length; on resumption every node alive before
// gets one lease duration from then, so a node that died during the outage
// goes one lease duration after contact resumed and the others stay.
func TestLivenessOutage(t *testing.T) {
	c := newClockedLiveness(t)
	c.advance(5*time.Second, time.Second, "a", "b", "c", "d")
	c.advance(4*time.Second, time.Second, "a", "b", "c") // d dies before the outage
	c.want("before the outage", map[string]bool{"a": true, "b": true, "c": true, "d": false})

	c.advance(10*time.Minute, 250*time.Millisecond)
	c.want("10 min into the outage", map[string]bool{"a": true, "b": true, "c": true, "d": false})

	// Contact resumes with a's renewal; b and c have not renewed yet.
	c.clock = c.clock.Add(100 * time.Millisecond)
	c.renewed("a")
	if c.resumes != 1 {
		t.Fatalf("resumed %d times, want 1", c.resumes)
	}
	c.want("contact resumed", map[string]bool{"a": true, "b": true, "c": true, "d": false})
	// b comes back, c died during the outage: c goes one duration later.
	c.advance(2500*time.Millisecond, 500*time.Millisecond, "a", "b")
	c.want("2.5 s after resumption", map[string]bool{"a": true, "b": true, "c": true, "d": false})
	c.advance(time.Second, 500*time.Millisecond, "a", "b")
	c.want("3.5 s after resumption", map[string]bool{"a": true, "b": true, "c": false, "d": false})
	if c.resumes != 1 {
		t.Errorf("resumed %d times, want 1", c.resumes)
	}
}

// TestLivenessOutageStartsMidway: b's last renewal came just before
// contact was lost and a's last round trip earlier: b must not expire
// while a is still deciding whether contact is lost.
func TestLivenessOutageStartsMidway(t *testing.T) {
	c := newClockedLiveness(t)
	c.advance(5*time.Second, time.Second, "a", "b")
	c.clock = c.clock.Add(900 * time.Millisecond)
	c.renewed("b")
	for range 40 {
		c.clock = c.clock.Add(100 * time.Millisecond)
		c.want("b renewed last, then the outage", map[string]bool{"a": true, "b": true})
	}
	c.clock = c.clock.Add(time.Hour)
	c.want("an hour into the outage", map[string]bool{"a": true, "b": true})
}

// TestLivenessWatchStuck: renewals succeed but the watch delivers
// nothing (not even this node's own renewals): the view freezes rather
// than declaring everyone else dead.
func TestLivenessWatchStuck(t *testing.T) {
	c := newClockedLiveness(t)
	c.advance(5*time.Second, time.Second, "a", "b")
	for range 60 {
		c.clock = c.clock.Add(time.Second)
		c.ownRenew = c.clock // writes land, the watch shows nothing
	}
	c.want("watch stuck for a minute", map[string]bool{"a": true, "b": true})
}

// TestLivenessShortFreeze: a round trip late by less than a lease
// duration freezes the view only for its length: a node dead from before
// is still detected, the frozen time not counted.
func TestLivenessShortFreeze(t *testing.T) {
	c := newClockedLiveness(t)
	c.advance(5*time.Second, time.Second, "a", "b")
	c.advance(time.Second, time.Second, "a") // b's last renewal was 1 s ago
	c.clock = c.clock.Add(2500 * time.Millisecond)
	c.renewed("a") // 2.5 s late: frozen for 1 s
	if c.resumes != 1 {
		t.Fatalf("resumed %d times, want 1", c.resumes)
	}
	c.want("after the late round trip", map[string]bool{"b": true})
	c.advance(500*time.Millisecond, 500*time.Millisecond, "a")
	c.want("3 s of b's silence in contact", map[string]bool{"b": false})
}

// TestLivenessPartition: only this node is cut off (its renewals fail,
// the others' renewals still reach it): it keeps its frozen view,
// itself included, and resumes announcing when its renewals come back.
func TestLivenessPartition(t *testing.T) {
	c := newClockedLiveness(t)
	c.advance(5*time.Second, time.Second, "a", "b")
	c.advance(time.Minute, time.Second, "b")
	c.want("cut off for a minute", map[string]bool{"a": true, "b": true})
	c.clock = c.clock.Add(time.Second)
	c.renewed("a")
	if c.resumes != 1 {
		t.Fatalf("resumed %d times, want 1", c.resumes)
	}
	c.want("back", map[string]bool{"a": true, "b": true})
}

// TestLivenessStartup: this node is not alive before its first renewal;
// the others are judged at the current time until contact is made.
func TestLivenessStartup(t *testing.T) {
	c := newClockedLiveness(t)
	c.ownRenew = time.Time{}
	c.renewed("b")
	c.want("before the first renewal", map[string]bool{"a": false, "b": true})
	c.clock = c.clock.Add(4 * time.Second)
	c.want("b silent, no contact yet", map[string]bool{"a": false, "b": false})
	c.ownRenew = c.clock
	c.renewed("a")
	c.want("renewed", map[string]bool{"a": true})
	if c.resumes != 0 {
		t.Errorf("first contact counted as a resumption")
	}
}

// TestLivenessOutageRightAfterStart: the apiserver hangs right after this
// node's first renewal, before any renewal came back through the watch:
// the first renewal counts as contact, and the view freezes.
func TestLivenessOutageRightAfterStart(t *testing.T) {
	c := newClockedLiveness(t)
	c.ownRenew = time.Time{}
	c.renewed("b", "a") // listed before this node's renewal landed
	c.clock = c.clock.Add(100 * time.Millisecond)
	c.renewedOwn()
	c.clock = c.clock.Add(time.Minute)
	c.want("a minute into an outage that began at once", map[string]bool{"a": true, "b": true})
}
