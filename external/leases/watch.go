package leases

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// Watch feeds the tracker every liveness Lease of its namespace (those
// labelled managed-by onehop, as Run creates them: not the allocator's
// Lease, which its leader renews every few seconds and which no node
// needs) until ctx ends. The returned stop shuts the Lease informer down.
//
// The tracker counts as synced once every Lease listed has been observed,
// not merely stored by the informer, and the hook is woken (changed) then:
// this node may be alive to itself from that moment on, and its own first
// renewal and the listing of its Lease, which wake the hook too, may both
// have come before.
func (l *Liveness) Watch(ctx context.Context) (stop func(), err error) {
	inf := informers.NewSharedInformerFactoryWithOptions(l.client, 0, informers.WithNamespace(l.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = managedByOnehop }))
	li := inf.Coordination().V1().Leases().Informer()
	reg, err := li.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { l.Observe(o.(*coordinationv1.Lease)) },
		UpdateFunc: func(_, o any) { l.Observe(o.(*coordinationv1.Lease)) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if lease, ok := o.(*coordinationv1.Lease); ok {
				l.Forget(lease.Name)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.synced = reg.HasSynced
	l.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	inf.Start(wctx.Done())
	go func() {
		select {
		case <-wctx.Done():
		case <-reg.HasSyncedChecker().Done():
			l.changed()
		}
	}()
	return func() { cancel(); inf.Shutdown() }, nil
}
