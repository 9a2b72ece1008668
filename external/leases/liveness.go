package leases

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// LeasePrefix names the per-node liveness Leases of the L2 provider.
const LeasePrefix = "onehop-l2-"

// managedByOnehop selects the liveness Leases (renewOnce labels them).
const managedByOnehop = "app.kubernetes.io/managed-by=onehop"

// Liveness tracks which agents are alive through one coordination Lease per
// node, renewed by its agent: Leases with an outage fallback.
//
// While the apiserver is reachable, a node is alive while its Lease changed
// within the lease duration, judged by when *this* agent saw it change (as
// client-go's leader election does), so clocks need not agree. An agent
// stopping cleanly deletes its Lease, and its IPs move at once; a crashed
// one moves after the lease duration.
//
// Contact. This agent is in contact with the apiserver while its own
// renewals come back to it through the Lease watch: the round trip proves
// both that its writes land and that the watch makes progress (a stuck
// watch would otherwise make every other node look dead). Contact counts as
// lost once no own renewal has come back for half a lease duration: late
// enough that a renewal running a little late does not trigger it, early
// enough that no node renewing on the same cadence can expire in between.
//
// Outage. Out of contact, the view freezes: every node is judged at the
// moment contact was lost, so the nodes alive then stay alive, this node
// included, for an outage of any length. The L2 owner of each IP keeps
// answering and BGP (which does not ask liveness) keeps announcing what the
// dataplane serves; nothing depends on the apiserver to keep serving.
//
// Resumption. When own renewals come back again, the nodes alive in the
// frozen view do not flap: after an outage of a lease duration or more each
// gets a fresh lease duration from the moment contact resumed (the others'
// first renewals after an outage may come back later than ours); after a
// shorter freeze the frozen time simply does not count. A node that really
// died during the outage is thus detected one lease duration after contact
// resumes. A node already dead in the frozen view stays dead.
//
// Partition (only this node is cut off; the others still see the
// apiserver): the others see this node's Lease expire, but before taking
// an IP over they probe for it on the segment; this node keeps its frozen
// view and keeps answering, so they hear it, count it alive for a lease
// duration (heard.go) and leave its IPs to it, probing again
// after. When this node's renewals come back, it announces every IP it
// owns again (resumed). A node that cannot write its own Lease while the
// watch works counts as cut off in the same way.
//
// Heartbeats. With a key, the nodes also send each other heartbeats on the
// node network (heartbeat.go): a node one of whose heartbeats was taken
// is judged by them (and by being heard answering since the last one),
// apiserver or not; the rest of this comment is about the nodes never
// heard that way. This node is dead to itself while its L2 links are all
// down.
type Liveness struct {
	client    kubernetes.Interface
	namespace string
	node      string
	renew     time.Duration
	duration  time.Duration
	log       *slog.Logger
	changed   func()
	now       func() time.Time

	// resumed, when set, is called after contact with the apiserver came
	// back from a freeze (the L2 provider announces its IPs again).
	resumed func()

	// synced reports whether every Lease the informer listed has been
	// observed (Watch); until then this node does not count itself alive,
	// so that it never claims an IP another node owns just because it has
	// not seen it yet.
	synced func() bool

	// linkAddrs, when set, are the link-layer addresses this node's L2
	// responder answers with; renewals publish them (heard.go).
	linkAddrs func() []string

	// beats, when set, is the other nodes' liveness by heartbeats on
	// the node network, which decides over the Leases for every node it
	// has heard (heartbeat.go); linkUp, when set, says whether this
	// node's L2 links are up: while they are not, this node is not alive
	// and does not renew its Lease.
	beats  Heartbeats
	linkUp func() bool
	// restarting, when set, says whether this agent, stopping, restarts
	// (heartbeat.go): its Lease then stays, as the others hold its IPs.
	restarting func() bool

	mu   sync.Mutex
	seen map[string]observed
	// ownRenew is this incarnation's last successful renewal (zero: none
	// yet, this node is not alive).
	ownRenew time.Time
	// contact is when an own renewal last came back through the watch
	// (zero: never yet; the view is then judged at the current time).
	contact time.Time
	// frozenSaid: the loss of contact was logged.
	frozenSaid bool
	// byMAC names the node each published link-layer address belongs to,
	// and heard is when each node was last heard announcing on the
	// segment (heard.go).
	byMAC map[string]string
	heard map[string]time.Time
	// heardSaid: the Lease version at which a node was last said to be
	// heard while its Lease expired (logged once per version).
	heardSaid map[string]string
}

// Heartbeats is a node's liveness by heartbeats (heartbeat.Heartbeat):
// known once one of its heartbeats was taken, then alive while the last
// one, at last, is recent enough.
type Heartbeats interface {
	Alive(node string) (alive, known bool, last time.Time)
	// Left: its last heartbeat said it leaves (a clean stop).
	Left(node string) bool
}

type observed struct {
	rv string
	at time.Time
}

// NewLiveness tracks the liveness Leases of namespace as node's agent,
// renewing node's own every renew; a node is dead once its Lease did not
// change for duration. changed is called when a node's liveness may have
// changed in a way a Lease's expiry does not tell (NextChange).
func NewLiveness(client kubernetes.Interface, namespace, node string, renew, duration time.Duration, log *slog.Logger, changed func()) *Liveness {
	if renew <= 0 {
		renew = time.Second
	}
	if duration <= renew {
		duration = 3 * renew
	}
	return &Liveness{client: client, namespace: namespace, node: node, renew: renew, duration: duration,
		log: log, changed: changed, now: time.Now, seen: map[string]observed{},
		byMAC: map[string]string{}, heard: map[string]time.Time{}, heardSaid: map[string]string{}}
}

// OnResumed has resumed called after contact with the apiserver came back
// from a freeze. Call it before Run.
func (l *Liveness) OnResumed(resumed func()) { l.resumed = resumed }

// PublishLinkAddrs has this node's renewals publish the link-layer
// addresses linkAddrs returns (those its L2 responder answers with).
// Call it before Run.
func (l *Liveness) PublishLinkAddrs(linkAddrs func() []string) { l.linkAddrs = linkAddrs }

// SetLinkUp has linkUp say whether this node's L2 links are up: while they
// are not, this node is not alive and does not renew its Lease.
func (l *Liveness) SetLinkUp(linkUp func() bool) {
	l.mu.Lock()
	l.linkUp = linkUp
	l.mu.Unlock()
}

// SetHeartbeats has beats, the other nodes' liveness by heartbeats,
// decide over the Leases for every node it has heard, and restarting say
// whether this agent, stopping, restarts: its Lease then stays.
func (l *Liveness) SetHeartbeats(beats Heartbeats, restarting func() bool) {
	l.mu.Lock()
	l.beats = beats
	l.restarting = restarting
	l.mu.Unlock()
}

// UseClock has the tracker read the time from now (time.Now by default).
func (l *Liveness) UseClock(now func() time.Time) { l.now = now }

// window is how long contact may go without an own renewal coming back.
func (l *Liveness) window() time.Duration { return l.duration / 2 }

// refLocked is the moment nodes are judged at: now while in contact, else
// the moment contact was deemed lost (frozen true).
func (l *Liveness) refLocked(now time.Time) (ref time.Time, frozen bool) {
	if l.contact.IsZero() {
		return now, false
	}
	if lost := l.contact.Add(l.window()); now.After(lost) {
		return lost, true
	}
	return now, false
}

// Observe records a Lease add or update.
func (l *Liveness) Observe(lease *coordinationv1.Lease) {
	node, ok := strings.CutPrefix(lease.Name, LeasePrefix)
	if !ok {
		return
	}
	now := l.now()
	l.mu.Lock()
	old, had := l.seen[node]
	at := now
	if !had && lease.Spec.RenewTime != nil && now.Sub(lease.Spec.RenewTime.Time) > l.duration {
		at = lease.Spec.RenewTime.Time // stale when we first see it: dead
	}
	if had && old.rv == lease.ResourceVersion {
		at = old.at
	}
	// A node judged dead that renews again (its agent started again after
	// a crash, which leaves the Lease behind) is alive from now: the hook
	// must look at once, or the node that took its IPs over would keep
	// answering beside it. A renewal of a node alive anyway changes
	// nothing the hook acts on.
	ref, _ := l.refLocked(now)
	back := had && node != l.node && at != old.at && ref.Sub(old.at) >= l.duration && ref.Sub(at) < l.duration
	var outage time.Duration
	resumed := false
	if node == l.node && at == now && !l.ownRenew.IsZero() {
		outage, resumed = l.contactLocked(now)
	}
	l.seen[node] = observed{rv: lease.ResourceVersion, at: at}
	l.publishedLocked(node, lease.Annotations[AnnotationLinkAddrs])
	l.mu.Unlock()
	if resumed {
		l.log.Info("l2 liveness: apiserver contact resumed; nodes alive before get a fresh grace period", "without", outage.Round(time.Millisecond))
		if l.resumed != nil {
			l.resumed()
		}
	}
	if !had || back || resumed {
		l.changed()
	}
}

// contactLocked records that an own renewal came back at now. After a
// freeze it moves the nodes alive in the frozen view forward (see the type's
// comment) and reports how long contact was lost.
func (l *Liveness) contactLocked(now time.Time) (time.Duration, bool) {
	ref, frozen := l.refLocked(now)
	prev := l.contact
	l.contact = now
	l.frozenSaid = false
	if !frozen {
		return 0, false
	}
	outage := now.Sub(prev)
	for n, o := range l.seen {
		if n == l.node || ref.Sub(o.at) >= l.duration {
			continue // dead before contact was lost: stays dead
		}
		if outage >= l.duration {
			o.at = later(o.at, now)
		} else {
			o.at = earlier(o.at.Add(now.Sub(ref)), now)
		}
		l.seen[n] = o
	}
	return outage, true
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Members are the nodes whose Leases this node sees, itself included: the
// peers of its heartbeats.
func (l *Liveness) Members() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.seen))
	for n := range l.seen {
		out = append(out, n)
	}
	return out
}

// Forget records that the Lease name is gone.
func (l *Liveness) Forget(name string) {
	node, ok := strings.CutPrefix(name, LeasePrefix)
	if !ok {
		return
	}
	l.mu.Lock()
	delete(l.seen, node)
	// Heard before its Lease went, it is not alive for that: its agent
	// stopped.
	delete(l.heard, node)
	l.publishedLocked(node, "")
	l.mu.Unlock()
	l.changed()
}

// Alive: another node whose heartbeats come (heartbeat.go), or, if none
// was ever taken from it, whose Lease changed within the lease duration
// before the reference moment (now, or when contact was lost); or that was
// heard announcing on the segment within a lease duration (HeardFrom),
// since its last heartbeat. This node once it has renewed its Lease and
// the Leases are listed, and from then on also while cut off from the
// apiserver (see the type's comment), while its L2 links are up.
func (l *Liveness) Alive(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if node == l.node {
		return (l.synced == nil || l.synced()) && !l.ownRenew.IsZero() && (l.linkUp == nil || l.linkUp())
	}
	return l.aliveLocked(node, l.now())
}

// Left: node stopped cleanly, and said so: its last heartbeat said it
// leaves, or its Lease is gone (deleted by its stopping agent). Nothing
// of it answers any more, or soon will not: its IPs are taken over
// without a probe for it.
func (l *Liveness) Left(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.beats != nil && l.beats.Left(node) {
		return true
	}
	_, ok := l.seen[node]
	return !ok
}

// linksUp: this node's L2 links are up, or not looked at.
func (l *Liveness) linksUp() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.linkUp == nil || l.linkUp()
}

func (l *Liveness) aliveLocked(node string, now time.Time) bool {
	h, heard := l.heard[node]
	heard = heard && now.Sub(h) < l.duration
	if l.beats != nil {
		if alive, known, last := l.beats.Alive(node); known {
			return alive || heard && h.After(last)
		}
	}
	if heard {
		return true
	}
	o, ok := l.seen[node]
	if !ok {
		return false
	}
	ref, _ := l.refLocked(now)
	return ref.Sub(o.at) < l.duration
}

// NextChange is the earliest moment a node alive now would be judged dead
// if no Lease event comes first (its renewal overdue, or its being heard
// on the segment too long ago); zero when none can (no other node alive,
// or the view is frozen and no node was heard). The hook sleeps until
// then instead of looking at every node several times a second: at 5,000
// nodes renewing every second the earliest expiry, once the others have
// renewed, lies a lease duration minus a renew interval ahead.
func (l *Liveness) NextChange() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	next := l.heardChangeLocked(now)
	ref, frozen := l.refLocked(now)
	if frozen {
		return next
	}
	for n, o := range l.seen {
		if n == l.node {
			continue
		}
		if exp := o.at.Add(l.duration); ref.Before(exp) && (next.IsZero() || exp.Before(next)) {
			next = exp
		}
	}
	return next
}

// frozen reports whether contact with the apiserver is lost now, and says so
// once in the log.
func (l *Liveness) frozen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, f := l.refLocked(l.now())
	if f && !l.frozenSaid {
		l.frozenSaid = true
		l.log.Warn("l2 liveness: apiserver out of reach; keeping the nodes alive when it was last reached", "since", l.contact)
	}
	return f
}

// Run renews this node's Lease until ctx ends, then deletes it, unless
// this agent restarts.
func (l *Liveness) Run(ctx context.Context) {
	t := time.NewTicker(l.renew)
	defer t.Stop()
	for {
		// A hung apiserver holds a request forever: bound each attempt,
		// so that renewals resume as soon as it answers again. While
		// this node's L2 links are down it does not renew: it cannot
		// answer, and the others take its IPs when the Lease expires.
		if l.linksUp() {
			rctx, cancel := context.WithTimeout(ctx, l.duration)
			err := l.renewOnce(rctx)
			cancel()
			if frozen := l.frozen(); err != nil && ctx.Err() == nil && !frozen {
				l.log.Warn("l2 liveness lease renewal failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			l.mu.Lock()
			r := l.restarting
			l.mu.Unlock()
			if r != nil && r() {
				return
			}
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = l.client.CoordinationV1().Leases(l.namespace).Delete(dctx, LeasePrefix+l.node, metav1.DeleteOptions{})
			cancel()
			return
		case <-t.C:
		}
	}
}

func (l *Liveness) renewOnce(ctx context.Context) error {
	leases := l.client.CoordinationV1().Leases(l.namespace)
	now := metav1.NewMicroTime(time.Now())
	secs := int32((l.duration + time.Second - 1) / time.Second)
	name := LeasePrefix + l.node
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "onehop"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &l.node, LeaseDurationSeconds: &secs, RenewTime: &now},
		}
		l.publish(lease)
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
	} else if err == nil {
		lease.Spec.HolderIdentity = &l.node
		lease.Spec.LeaseDurationSeconds = &secs
		lease.Spec.RenewTime = &now
		l.publish(lease)
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	l.RenewedOwn()
	return nil
}

// RenewedOwn records a successful renewal of this node's Lease.
func (l *Liveness) RenewedOwn() {
	l.mu.Lock()
	first := l.ownRenew.IsZero()
	l.ownRenew = l.now()
	if l.contact.IsZero() {
		// First contact: the watch may have delivered this renewal
		// before ownRenew was set, and an outage may begin before the
		// next one comes back.
		l.contact = l.ownRenew
	}
	l.mu.Unlock()
	if first {
		l.changed()
	}
}
