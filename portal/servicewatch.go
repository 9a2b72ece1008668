package portal

import (
	"context"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ServiceWatch is one watch of every Service and EndpointSlice of the
// cluster, for the model (Informers.Watch) and another reader that needs
// all of them (the cloud hook: who holds an address, which nodes serve
// it), so that an agent receives and caches each object once instead of
// twice. The cache holds objects trimmed by TrimForSharedCache: they must
// not be written back whole. The model applies its label selection to what
// the watch delivers (it would otherwise ask the API server for only its
// part).
type ServiceWatch struct {
	factory  informers.SharedInformerFactory
	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
}

// NewServiceWatch builds the watch; nothing runs until Start.
func NewServiceWatch(client kubernetes.Interface, resync time.Duration) *ServiceWatch {
	f := informers.NewSharedInformerFactoryWithOptions(client, resync, informers.WithTransform(TrimForSharedCache))
	return &ServiceWatch{factory: f, services: f.Core().V1().Services().Informer(), slices: f.Discovery().V1().EndpointSlices().Informer()}
}

// Services is the informer of every Service.
func (w *ServiceWatch) Services() cache.SharedIndexInformer { return w.services }

// Slices is the informer of every EndpointSlice.
func (w *ServiceWatch) Slices() cache.SharedIndexInformer { return w.slices }

// Start starts the watch unless it runs already: each reader calls it, and
// the first caller's ctx stops it.
func (w *ServiceWatch) Start(ctx context.Context) { w.factory.Start(ctx.Done()) }
