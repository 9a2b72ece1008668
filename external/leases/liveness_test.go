package leases_test

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/internal/fakecluster"
	"github.com/onehop/onehop/external/leases"
)

func TestLivenessNodeDiesWhileInContact(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	c.Advance(5*time.Second, time.Second, "a", "b", "c")
	c.Want("all renewing", map[string]bool{"a": true, "b": true, "c": true})
	c.Advance(2500*time.Millisecond, 500*time.Millisecond, "a", "c")
	c.Want("b silent 2.5 s", map[string]bool{"a": true, "b": true, "c": true})
	c.Advance(time.Second, 500*time.Millisecond, "a", "c")
	c.Want("b silent 3.5 s", map[string]bool{"a": true, "b": false, "c": true})
	if c.Resumes != 0 {
		t.Errorf("resumed %d times without an outage", c.Resumes)
	}
}

// TestLivenessNodeBack: a node whose agent crashed leaves its Lease
// behind; when a new agent renews it, the node is alive again and the
// hook is woken at once (the node that took its IPs over must give them
// back), whether the Lease was seen alive before or was already stale when
// first listed. Renewals of a node alive anyway wake nothing.
func TestLivenessNodeBack(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	c.Advance(5*time.Second, time.Second, "a", "b")
	c.Changes = 0
	c.Advance(5*time.Second, time.Second, "a", "b")
	if c.Changes != 0 {
		t.Errorf("renewals of live nodes woke the hook %d times", c.Changes)
	}
	c.Advance(4*time.Second, time.Second, "a") // b's agent crashed
	c.Want("b's agent dead", map[string]bool{"b": false})
	c.Changes = 0
	c.Clock = c.Clock.Add(300 * time.Millisecond)
	c.Renewed("b") // its new agent's first renewal
	c.Want("b's agent started again", map[string]bool{"b": true})
	if c.Changes != 1 {
		t.Errorf("b back: the hook was woken %d times, want 1", c.Changes)
	}

	// c's Lease is stale when first listed (its agent died long ago).
	stale := metav1.NewMicroTime(c.Clock.Add(-time.Minute))
	c.Observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leases.LeasePrefix + "c", ResourceVersion: "stale"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &stale}})
	c.Want("c listed stale", map[string]bool{"c": false})
	c.Changes = 0
	c.Clock = c.Clock.Add(time.Second)
	c.Renewed("c")
	c.Want("c's agent started", map[string]bool{"c": true})
	if c.Changes != 1 {
		t.Errorf("c back: the hook was woken %d times, want 1", c.Changes)
	}
}

// TestLivenessOutage: the apiserver hangs (no Lease changes reach anyone);
// the view freezes for any length; on resumption every node alive before
// gets one lease duration from then, so a node that died during the outage
// goes one lease duration after contact resumed and the others stay.
func TestLivenessOutage(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	c.Advance(5*time.Second, time.Second, "a", "b", "c", "d")
	c.Advance(4*time.Second, time.Second, "a", "b", "c") // d dies before the outage
	c.Want("before the outage", map[string]bool{"a": true, "b": true, "c": true, "d": false})

	c.Advance(10*time.Minute, 250*time.Millisecond)
	c.Want("10 min into the outage", map[string]bool{"a": true, "b": true, "c": true, "d": false})

	// Contact resumes with a's renewal; b and c have not renewed yet.
	c.Clock = c.Clock.Add(100 * time.Millisecond)
	c.Renewed("a")
	if c.Resumes != 1 {
		t.Fatalf("resumed %d times, want 1", c.Resumes)
	}
	c.Want("contact resumed", map[string]bool{"a": true, "b": true, "c": true, "d": false})
	// b comes back, c died during the outage: c goes one duration later.
	c.Advance(2500*time.Millisecond, 500*time.Millisecond, "a", "b")
	c.Want("2.5 s after resumption", map[string]bool{"a": true, "b": true, "c": true, "d": false})
	c.Advance(time.Second, 500*time.Millisecond, "a", "b")
	c.Want("3.5 s after resumption", map[string]bool{"a": true, "b": true, "c": false, "d": false})
	if c.Resumes != 1 {
		t.Errorf("resumed %d times, want 1", c.Resumes)
	}
}

// TestLivenessOutageStartsMidway: b's last renewal came just before
// contact was lost and a's last round trip earlier: b must not expire
// while a is still deciding whether contact is lost.
func TestLivenessOutageStartsMidway(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	c.Advance(5*time.Second, time.Second, "a", "b")
	c.Clock = c.Clock.Add(900 * time.Millisecond)
	c.Renewed("b")
	for range 40 {
		c.Clock = c.Clock.Add(100 * time.Millisecond)
		c.Want("b renewed last, then the outage", map[string]bool{"a": true, "b": true})
	}
	c.Clock = c.Clock.Add(time.Hour)
	c.Want("an hour into the outage", map[string]bool{"a": true, "b": true})
}

// TestLivenessWatchStuck: renewals succeed but the watch delivers
// nothing (not even this node's own renewals): the view freezes rather
// than declaring everyone else dead.
func TestLivenessWatchStuck(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	c.Advance(5*time.Second, time.Second, "a", "b")
	for range 60 {
		c.Clock = c.Clock.Add(time.Second)
		c.RenewedOwn() // writes land, the watch shows nothing
	}
	c.Want("watch stuck for a minute", map[string]bool{"a": true, "b": true})
}

// TestLivenessShortFreeze: a round trip late by less than a lease
// duration freezes the view only for its length: a node dead from before
// is still detected, the frozen time not counted.
func TestLivenessShortFreeze(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	c.Advance(5*time.Second, time.Second, "a", "b")
	c.Advance(time.Second, time.Second, "a") // b's last renewal was 1 s ago
	c.Clock = c.Clock.Add(2500 * time.Millisecond)
	c.Renewed("a") // 2.5 s late: frozen for 1 s
	if c.Resumes != 1 {
		t.Fatalf("resumed %d times, want 1", c.Resumes)
	}
	c.Want("after the late round trip", map[string]bool{"b": true})
	c.Advance(500*time.Millisecond, 500*time.Millisecond, "a")
	c.Want("3 s of b's silence in contact", map[string]bool{"b": false})
}

// TestLivenessPartition: only this node is cut off (its renewals fail,
// the others' renewals still reach it): it keeps its frozen view,
// itself included, and resumes announcing when its renewals come back.
func TestLivenessPartition(t *testing.T) {
	c := fakecluster.NewClocked(t, true)
	c.Advance(5*time.Second, time.Second, "a", "b")
	c.Advance(time.Minute, time.Second, "b")
	c.Want("cut off for a minute", map[string]bool{"a": true, "b": true})
	c.Clock = c.Clock.Add(time.Second)
	c.Renewed("a")
	if c.Resumes != 1 {
		t.Fatalf("resumed %d times, want 1", c.Resumes)
	}
	c.Want("back", map[string]bool{"a": true, "b": true})
}

// TestLivenessStartup: this node is not alive before its first renewal;
// the others are judged at the current time until contact is made.
func TestLivenessStartup(t *testing.T) {
	c := fakecluster.NewClocked(t, false)
	c.Renewed("b")
	c.Want("before the first renewal", map[string]bool{"a": false, "b": true})
	c.Clock = c.Clock.Add(4 * time.Second)
	c.Want("b silent, no contact yet", map[string]bool{"a": false, "b": false})
	c.RenewedOwn()
	c.Renewed("a")
	c.Want("renewed", map[string]bool{"a": true})
	if c.Resumes != 0 {
		t.Errorf("first contact counted as a resumption")
	}
}

// TestLivenessOutageRightAfterStart: the apiserver hangs right after this
// node's first renewal, before any renewal came back through the watch:
// the first renewal counts as contact, and the view freezes.
func TestLivenessOutageRightAfterStart(t *testing.T) {
	c := fakecluster.NewClocked(t, false)
	c.Renewed("b", "a") // listed before this node's renewal landed
	c.Clock = c.Clock.Add(100 * time.Millisecond)
	c.RenewedOwn()
	c.Clock = c.Clock.Add(time.Minute)
	c.Want("a minute into an outage that began at once", map[string]bool{"a": true, "b": true})
}
