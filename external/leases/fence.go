package external

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// errRenewDeadline ends a leadership term whose Lease was not renewed
// within the renew deadline.
var errRenewDeadline = errors.New("the allocator Lease was not renewed within its renew deadline")

// leaseFence bounds a leadership term by the Lease's renewals, as
// client-go's leader election bounds its own: the term ends RenewDeadline
// after the start of the last acquire or renewal that succeeded. Another
// candidate can take the Lease only LeaseDuration after it saw that
// renewal, and RenewDeadline < LeaseDuration, so the term is over before
// anyone else's can begin, whether or not this process hears from the
// apiserver again (a partition, a hung request, a stopped process that
// resumes).
type leaseFence struct {
	renewDeadline time.Duration

	mu sync.Mutex
	// deadline is the renew deadline of the last successful renewal (a
	// monotonic clock reading).
	deadline time.Time
	// timer ends the running term at deadline; nil between terms.
	timer *time.Timer
}

// renewed records that a renewal (or the acquire) sent at start succeeded.
func (f *leaseFence) renewed(start time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d := start.Add(f.renewDeadline); d.After(f.deadline) {
		f.deadline = d
	}
	if f.timer != nil {
		f.timer.Reset(time.Until(f.deadline))
	}
}

// begin starts a term in parent: the context it returns ends with parent,
// at the renew deadline (cause errRenewDeadline), or at cancel.
func (f *leaseFence) begin(parent context.Context) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	f.mu.Lock()
	if f.timer != nil {
		f.timer.Stop()
	}
	t := time.AfterFunc(time.Until(f.deadline), func() { cancel(errRenewDeadline) })
	f.timer = t
	f.mu.Unlock()
	context.AfterFunc(ctx, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		t.Stop()
		if f.timer == t {
			f.timer = nil
		}
	})
	return ctx, cancel
}

// fencedLock is the allocator Lease's lock, telling fence of every
// successful acquire and renewal by this candidate. It also keeps a
// release to a Lease this candidate holds: client-go's release reads the
// Lease, then judges whether it leads by the record it saw last, so a
// leader cut off from the apiserver would, once back, release (and
// then take) the Lease another candidate acquired meanwhile.
type fencedLock struct {
	resourcelock.Interface
	fence *leaseFence

	mu sync.Mutex
	// holder is the holder the last Get read.
	holder string
}

func (l *fencedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	if err == nil {
		l.mu.Lock()
		l.holder = r.HolderIdentity
		l.mu.Unlock()
	}
	return r, raw, err
}

func (l *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := time.Now()
	err := l.Interface.Create(ctx, r)
	l.note(start, r, err)
	return err
}

func (l *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if r.HolderIdentity == "" {
		l.mu.Lock()
		holder := l.holder
		l.mu.Unlock()
		if holder != l.Identity() {
			return fmt.Errorf("not releasing the allocator Lease: %q holds it", holder)
		}
	}
	start := time.Now()
	err := l.Interface.Update(ctx, r)
	l.note(start, r, err)
	return err
}

func (l *fencedLock) note(start time.Time, r resourcelock.LeaderElectionRecord, err error) {
	if err != nil {
		return
	}
	l.mu.Lock()
	l.holder = r.HolderIdentity
	l.mu.Unlock()
	if r.HolderIdentity == l.Identity() {
		l.fence.renewed(start)
	}
}

// leaderEventSink writes the leader's events (allocations, refusals,
// webhook failures, next hops) within its leadership term only: an event
// recorded in a term and not written when the term ends is dropped, and
// a write in flight is cancelled with the term.
type leaderEventSink struct {
	events typedcorev1.EventsGetter
	// term is the running term's context, nil between terms.
	term func() context.Context
}

// A dropped event is answered as written, so that the broadcaster does
// not retry it into a later term.

func (s leaderEventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	ctx := s.term()
	if ctx == nil {
		return e, nil
	}
	return s.events.Events(e.Namespace).Create(ctx, e, metav1.CreateOptions{})
}

func (s leaderEventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	ctx := s.term()
	if ctx == nil {
		return e, nil
	}
	return s.events.Events(e.Namespace).Update(ctx, e, metav1.UpdateOptions{})
}

func (s leaderEventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	ctx := s.term()
	if ctx == nil {
		return e, nil
	}
	return s.events.Events(e.Namespace).Patch(ctx, e.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
}
