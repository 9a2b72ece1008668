package external

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

// leasePrefix names the per-node liveness Leases of the L2 provider.
const leasePrefix = "onehop-l2-"

// liveness tracks which agents are alive through one coordination Lease per
// node, renewed by its agent. Others judge a Lease by when *they* saw it
// change (as client-go's leader election does), so clocks need not agree. An
// agent stopping cleanly deletes its Lease, and its IPs move at once.
//
// Why Leases and not a gossip protocol (memberlist): the agents already
// talk to the apiserver, so there is no extra port, firewall rule or
// encryption key to manage, and the state is visible with kubectl. The cost
// is one small write per node per renew interval.
type liveness struct {
	client    kubernetes.Interface
	namespace string
	node      string
	renew     time.Duration
	duration  time.Duration
	log       *slog.Logger
	changed   func()

	// synced reports whether the Lease informer has listed every Lease;
	// until then this node does not count itself alive, so that it never
	// claims an IP another node owns just because it has not seen it yet.
	synced func() bool

	mu       sync.Mutex
	seen     map[string]observed
	ownRenew time.Time
}

type observed struct {
	rv string
	at time.Time
}

func newLiveness(client kubernetes.Interface, namespace, node string, renew, duration time.Duration, log *slog.Logger, changed func()) *liveness {
	if renew <= 0 {
		renew = time.Second
	}
	if duration <= renew {
		duration = 3 * renew
	}
	return &liveness{client: client, namespace: namespace, node: node, renew: renew, duration: duration,
		log: log, changed: changed, seen: map[string]observed{}}
}

// observe records a Lease add or update.
func (l *liveness) observe(lease *coordinationv1.Lease) {
	node, ok := strings.CutPrefix(lease.Name, leasePrefix)
	if !ok {
		return
	}
	now := time.Now()
	l.mu.Lock()
	old, had := l.seen[node]
	at := now
	if !had && lease.Spec.RenewTime != nil && now.Sub(lease.Spec.RenewTime.Time) > l.duration {
		at = lease.Spec.RenewTime.Time // stale when we first see it: dead
	}
	if had && old.rv == lease.ResourceVersion {
		at = old.at
	}
	l.seen[node] = observed{rv: lease.ResourceVersion, at: at}
	l.mu.Unlock()
	if !had {
		l.changed()
	}
}

func (l *liveness) forget(name string) {
	node, ok := strings.CutPrefix(name, leasePrefix)
	if !ok {
		return
	}
	l.mu.Lock()
	delete(l.seen, node)
	l.mu.Unlock()
	l.changed()
}

// alive: a node whose Lease changed within duration; this node while its
// own renewals succeed (so that a node cut off from the apiserver gives its
// IPs up, as the others expect).
func (l *liveness) alive(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if node == l.node {
		return (l.synced == nil || l.synced()) && time.Since(l.ownRenew) < l.duration
	}
	o, ok := l.seen[node]
	return ok && time.Since(o.at) < l.duration
}

// run renews this node's Lease until ctx ends, then deletes it.
func (l *liveness) run(ctx context.Context) {
	t := time.NewTicker(l.renew)
	defer t.Stop()
	for {
		if err := l.renewOnce(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("l2 liveness lease renewal failed", "err", err)
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = l.client.CoordinationV1().Leases(l.namespace).Delete(dctx, leasePrefix+l.node, metav1.DeleteOptions{})
			cancel()
			return
		case <-t.C:
		}
	}
}

func (l *liveness) renewOnce(ctx context.Context) error {
	leases := l.client.CoordinationV1().Leases(l.namespace)
	now := metav1.NewMicroTime(time.Now())
	secs := int32((l.duration + time.Second - 1) / time.Second)
	name := leasePrefix + l.node
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "onehop"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &l.node, LeaseDurationSeconds: &secs, RenewTime: &now},
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
	} else if err == nil {
		lease.Spec.HolderIdentity = &l.node
		lease.Spec.LeaseDurationSeconds = &secs
		lease.Spec.RenewTime = &now
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	wasDead := time.Since(l.ownRenew) >= l.duration
	l.ownRenew = time.Now()
	l.mu.Unlock()
	if wasDead {
		l.changed()
	}
	return nil
}
