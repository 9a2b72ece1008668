package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// TestLeaseFence: a term ends at the renew deadline of the last renewal,
// at once when that is past; a renewal moves it on.
func TestLeaseFence(t *testing.T) {
	f := NewFence(time.Hour)
	f.renewed(time.Now())
	ctx, cancel := f.Begin(t.Context())
	if ctx.Err() != nil {
		t.Fatalf("a term within its renew deadline ended: %v", context.Cause(ctx))
	}
	cancel(nil)

	f = NewFence(time.Second)
	f.renewed(time.Now().Add(-time.Hour))
	ctx, cancel = f.Begin(t.Context())
	defer cancel(nil)
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), ErrRenewDeadline) {
		t.Fatalf("a term past its renew deadline ended with %v", context.Cause(ctx))
	}
}

// fakeLock is a resourcelock.Interface over one record in memory.
type fakeLock struct {
	id      string
	rec     resourcelock.LeaderElectionRecord
	updates int
}

func (l *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r := l.rec
	return &r, []byte(r.HolderIdentity), nil
}
func (l *fakeLock) Create(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	l.rec = r
	return nil
}
func (l *fakeLock) Update(_ context.Context, r resourcelock.LeaderElectionRecord) error {
	l.rec, l.updates = r, l.updates+1
	return nil
}
func (l *fakeLock) RecordEvent(string) {}
func (l *fakeLock) Identity() string   { return l.id }
func (l *fakeLock) Describe() string   { return "fake" }

// TestFencedLockRelease: a release goes through only while the Lease
// read last names this candidate; a renewal by it moves the fence on.
func TestFencedLockRelease(t *testing.T) {
	ctx := t.Context()
	inner := &fakeLock{id: "a", rec: resourcelock.LeaderElectionRecord{HolderIdentity: "b"}}
	f := NewFence(time.Hour)
	l := &FencedLock{Interface: inner, fence: f}
	if _, _, err := l.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{}); err == nil || inner.rec.HolderIdentity != "b" {
		t.Fatalf("a released b's Lease: %v, holder %q", err, inner.rec.HolderIdentity)
	}
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "a"}); err != nil {
		t.Fatal(err)
	}
	if f.deadline.IsZero() {
		t.Fatal("a's renewal did not move the fence")
	}
	if err := l.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil || inner.rec.HolderIdentity != "" {
		t.Fatalf("a could not release its own Lease: %v, holder %q", err, inner.rec.HolderIdentity)
	}
}

// TestLeaderEventSink: the leader's events are written within a term
// only.
func TestLeaderEventSink(t *testing.T) {
	c := fake.NewClientset()
	var term context.Context
	s := NewEventSink(c.CoreV1(), func() context.Context { return term })
	ev := func(name string) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Reason: "IPAllocated"}
	}
	if _, err := s.Create(ev("outside")); err != nil {
		t.Fatal(err)
	}
	term = t.Context()
	if _, err := s.Create(ev("inside")); err != nil {
		t.Fatal(err)
	}
	evs, err := c.CoreV1().Events("default").List(t.Context(), metav1.ListOptions{})
	if err != nil || len(evs.Items) != 1 || evs.Items[0].Name != "inside" {
		t.Fatalf("events written: %+v, %v; want the one of the term", evs, err)
	}
}
