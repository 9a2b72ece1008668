package external

import (
	"context"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// watchLiveness feeds the liveness tracker every liveness Lease of the
// lease namespace (those labelled managed-by onehop, as renewOnce creates
// them: not the allocator's Lease, which its leader renews every few
// seconds and which no node needs) and renews this node's own until ctx ends (a goroutine of wg), and starts the heartbeats with it.
// The returned stop shuts the Lease informer down.
func (h *Hook) watchLiveness(ctx context.Context, wg *sync.WaitGroup) (stop func(), err error) {
	h.leaseInf = informers.NewSharedInformerFactoryWithOptions(h.client, 0, informers.WithNamespace(h.conf().LeaseNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = managedByOnehop }))
	li := h.leaseInf.Coordination().V1().Leases().Informer()
	h.liveness.mu.Lock()
	h.liveness.synced = li.HasSynced
	h.liveness.mu.Unlock()
	if _, err := li.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { h.liveness.observe(o.(*coordinationv1.Lease)) },
		UpdateFunc: func(_, o any) { h.liveness.observe(o.(*coordinationv1.Lease)) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if l, ok := o.(*coordinationv1.Lease); ok {
				h.liveness.forget(l.Name)
			}
		},
	}); err != nil {
		return nil, err
	}
	h.leaseInf.Start(ctx.Done())
	h.startHeartbeat(ctx, wg)
	wg.Go(func() { h.liveness.run(ctx) })
	return h.leaseInf.Shutdown, nil
}
