package leases

import (
	"context"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// AllocatorLeaseName is the Lease the LoadBalancer IP allocator (and the
// webhook sender) is elected with.
const AllocatorLeaseName = "onehop-external"

// ReleaseHeld gives up the Lease of lock if it names this candidate, as
// client-go releases it, within timeout; it reports whether the Lease is
// not this candidate's now. node names this node in the log.
func ReleaseHeld(ctx context.Context, lock resourcelock.Interface, timeout time.Duration, log *slog.Logger, node string) bool {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, _, err := lock.Get(rctx)
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		return false
	}
	if r.HolderIdentity != lock.Identity() {
		return true
	}
	now := metav1.NewTime(time.Now())
	err = lock.Update(rctx, resourcelock.LeaderElectionRecord{LeaderTransitions: r.LeaderTransitions,
		LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now})
	if err != nil {
		log.Warn("external: giving up the allocator lease this candidate held", "err", err)
		return false
	}
	log.Info("external: gave up the allocator lease this candidate held; it cannot lead now", "node", node)
	return true
}
