package leases

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

// ErrRenewDeadline ends a leadership term whose Lease was not renewed
// within the renew deadline.
var ErrRenewDeadline = errors.New("the allocator Lease was not renewed within its renew deadline")

// Fence bounds a leadership term by the Lease's renewals, as
// client-go's leader election bounds its own: the term ends RenewDeadline
// after the start of the last acquire or renewal that succeeded. Another
// candidate can take the Lease only LeaseDuration after it saw that
// renewal, and RenewDeadline < LeaseDuration, so the term is over before
// anyone else's can begin, whether or not this process hears from the
// apiserver again (a partition, a hung request, a stopped process that
// resumes).
type Fence struct {
	renewDeadline time.Duration

	mu sync.Mutex
	// deadline is the renew deadline of the last successful renewal (a
	// monotonic clock reading).
	deadline time.Time
	// timer ends the running term at deadline; nil between terms.
	timer *time.Timer
}

// NewFence bounds terms by renewDeadline, the elector's.
func NewFence(renewDeadline time.Duration) *Fence { return &Fence{renewDeadline: renewDeadline} }

// renewed records that a renewal (or the acquire) sent at start succeeded.
func (f *Fence) renewed(start time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d := start.Add(f.renewDeadline); d.After(f.deadline) {
		f.deadline = d
	}
	if f.timer != nil {
		f.timer.Reset(time.Until(f.deadline))
	}
}

// Begin starts a term in parent: the context it returns ends with parent,
// at the renew deadline (cause ErrRenewDeadline), or at cancel.
func (f *Fence) Begin(parent context.Context) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	f.mu.Lock()
	if f.timer != nil {
		f.timer.Stop()
	}
	t := time.AfterFunc(time.Until(f.deadline), func() { cancel(ErrRenewDeadline) })
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

// FencedLock is the allocator Lease's lock, telling fence of every
// successful acquire and renewal by this candidate. It also keeps a
// release to a Lease this candidate holds: client-go's release reads the
// Lease, then judges whether it leads by the record it saw last, so a
// leader cut off from the apiserver would, once back, release (and
// then take) the Lease another candidate acquired meanwhile.
type FencedLock struct {
	resourcelock.Interface
	fence *Fence

	mu sync.Mutex
	// holder is the holder the last Get read.
	holder string
}

// NewFencedLock is lock telling fence of this candidate's acquires and
// renewals.
func NewFencedLock(lock resourcelock.Interface, fence *Fence) *FencedLock {
	return &FencedLock{Interface: lock, fence: fence}
}

// Get reads the Lease and remembers its holder.
func (l *FencedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	if err == nil {
		l.mu.Lock()
		l.holder = r.HolderIdentity
		l.mu.Unlock()
	}
	return r, raw, err
}

// Create creates the Lease; a success is a renewal.
func (l *FencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	start := time.Now()
	err := l.Interface.Create(ctx, r)
	l.note(start, r, err)
	return err
}

// Update writes the Lease, a renewal or a release; a release of a Lease
// another candidate holds (as the last Get read it) is refused.
func (l *FencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
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

func (l *FencedLock) note(start time.Time, r resourcelock.LeaderElectionRecord, err error) {
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

// EventSink writes the leader's events (allocations, refusals,
// webhook failures, next hops) within its leadership term only: an event
// recorded in a term and not written when the term ends is dropped, and
// a write in flight is cancelled with the term.
type EventSink struct {
	events typedcorev1.EventsGetter
	// term is the running term's context, nil between terms.
	term func() context.Context
}

// NewEventSink writes events through events, each in the term term
// returns (nil between terms).
func NewEventSink(events typedcorev1.EventsGetter, term func() context.Context) EventSink {
	return EventSink{events: events, term: term}
}

// A dropped event is answered as written, so that the broadcaster does
// not retry it into a later term.

// Create writes a new event in the running term.
func (s EventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	ctx := s.term()
	if ctx == nil {
		return e, nil
	}
	return s.events.Events(e.Namespace).Create(ctx, e, metav1.CreateOptions{})
}

// Update writes a repeated event in the running term.
func (s EventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	ctx := s.term()
	if ctx == nil {
		return e, nil
	}
	return s.events.Events(e.Namespace).Update(ctx, e, metav1.UpdateOptions{})
}

// Patch writes a repeated event in the running term.
func (s EventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	ctx := s.term()
	if ctx == nil {
		return e, nil
	}
	return s.events.Events(e.Namespace).Patch(ctx, e.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
}
