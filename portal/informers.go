package portal

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Source is where the model's objects come from: something that feeds a
// Tracker until ctx ends and reports when its first listing is complete.
type Source interface {
	Start(ctx context.Context, t *Tracker) (synced func() bool, err error)
}

// Informers is the Source backed by client-go shared informers.
type Informers struct {
	Client   kubernetes.Interface
	NodeName string
	// ServiceProxyName selects Services labelled for this proxy (see Config).
	ServiceProxyName string
	Resync           time.Duration
	// Watch, when set, is where Services and EndpointSlices come from: a
	// watch of all of them shared with the cloud hook, which this Source
	// starts and selects from (the label selection applied here instead
	// of by the API server). Otherwise the Source watches its own part.
	Watch *ServiceWatch
	// ServiceCIDRs, when set, watches ServiceCIDR objects into the
	// Tracker (see servicecidrs.go): what a node agent needs, which the
	// controller's model of problems does not.
	ServiceCIDRs bool
	// Log tells when the API server has no ServiceCIDR API; nil: discarded.
	Log *slog.Logger
}

// serviceSelector selects the Services a proxy named name serves, as
// kube-proxy: labelled for this proxy (or for none, when name is "").
func serviceSelector(name string) (labels.Selector, error) {
	op, values := selection.DoesNotExist, []string(nil)
	if name != "" {
		op, values = selection.Equals, []string{name}
	}
	r, err := labels.NewRequirement(LabelServiceProxyName, op, values)
	if err != nil {
		return nil, err
	}
	return labels.NewSelector().Add(*r), nil
}

// sliceSelector selects the EndpointSlices a proxy reads, as kube-proxy:
// those not labelled headless. The EndpointSlice controller sets that label
// on the slices of a Service without a cluster IP (and removes it from the
// others', whatever the Service's own labels say); a slice written by hand
// with it is not served.
func sliceSelector() labels.Selector {
	r, _ := labels.NewRequirement(LabelHeadless, selection.DoesNotExist, nil) // a valid key: no error
	return labels.NewSelector().Add(*r)
}

// Start implements Source.
func (s *Informers) Start(ctx context.Context, t *Tracker) (func() bool, error) {
	svcSel, err := serviceSelector(s.ServiceProxyName)
	if err != nil {
		return nil, err
	}
	sliceSel := sliceSelector()
	nf := informers.NewSharedInformerFactoryWithOptions(s.Client, s.Resync, informers.WithTransform(TrimForCache),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.NodeName).String()
		}))
	var factories []informers.SharedInformerFactory
	var svcs, eps cache.SharedIndexInformer
	// svcMatch and sliceMatch are the selections the handlers apply: all
	// of it over a shared watch, none where the API server selects.
	svcMatch, sliceMatch := svcSel, sliceSel
	if s.Watch != nil {
		svcs, eps = s.Watch.Services(), s.Watch.Slices()
	} else {
		svcs = selectedFactory(s, svcSel, &factories).Core().V1().Services().Informer()
		eps = selectedFactory(s, sliceSel, &factories).Discovery().V1().EndpointSlices().Informer()
		svcMatch, sliceMatch = labels.Everything(), labels.Everything()
	}
	nodes := nf.Core().V1().Nodes().Informer()
	// Synced means every object of the first listing has reached the
	// Tracker, not only the informer's store: the first sync replaces the
	// whole ruleset, and a store that is full while the handler is still
	// behind would program part of the cluster (and drop the rest) for as
	// long as the handler takes to catch up.
	svcReg, err := svcs.AddEventHandler(selected(svcMatch, t.SetService, func(svc *v1.Service) { t.DeleteService(svc.Namespace, svc.Name) }))
	if err != nil {
		return nil, err
	}
	epsReg, err := eps.AddEventHandler(selected(sliceMatch, t.SetSlice, t.DeleteSlice))
	if err != nil {
		return nil, err
	}
	nodeReg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { withType(o, t.SetNode) },
		UpdateFunc: func(_, o any) { withType(o, t.SetNode) },
	})
	if err != nil {
		return nil, err
	}
	cidrsSynced, err := s.startServiceCIDRs(ctx, t)
	if err != nil {
		return nil, err
	}
	if s.Watch != nil {
		s.Watch.Start(ctx)
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	nf.Start(ctx.Done())
	return func() bool {
		return svcReg.HasSynced() && epsReg.HasSynced() && nodeReg.HasSynced() && cidrsSynced()
	}, nil
}

// selectedFactory is an informer factory whose every list and watch asks
// the API server for what sel selects, added to all.
func selectedFactory(s *Informers, sel labels.Selector, all *[]informers.SharedInformerFactory) informers.SharedInformerFactory {
	// The tweak runs at every list and watch, long after Start returns:
	// it holds the selector's text.
	text := sel.String()
	f := informers.NewSharedInformerFactoryWithOptions(s.Client, s.Resync, informers.WithTransform(TrimForCache),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = text }))
	*all = append(*all, f)
	return f
}

// selected is the handler that tells set and del of the objects sel
// selects: an object whose labels leave the selection is deleted, as the
// API server's own selection would have sent it.
func selected[T metav1.Object](sel labels.Selector, set, del func(T)) cache.ResourceEventHandler {
	in := func(o T) bool { return sel.Matches(labels.Set(o.GetLabels())) }
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if v, ok := unwrap[T](o); ok && in(v) {
				set(v)
			}
		},
		UpdateFunc: func(old, o any) {
			v, ok := unwrap[T](o)
			switch {
			case !ok:
			case in(v):
				set(v)
			case wasIn(old, in):
				del(v)
			}
		},
		DeleteFunc: func(o any) {
			if v, ok := unwrap[T](o); ok && in(v) {
				del(v)
			}
		},
	}
}

func wasIn[T any](o any, in func(T) bool) bool {
	v, ok := unwrap[T](o)
	return ok && in(v)
}

func unwrap[T any](o any) (T, bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	v, ok := o.(T)
	return v, ok
}

func withType[T any](o any, fn func(T)) {
	if v, ok := unwrap[T](o); ok {
		fn(v)
	}
}

// EventReporter turns Problems into Warning events on the Service and log lines.
type EventReporter struct {
	Recorder record.EventRecorder // may be nil: log only
	Log      *slog.Logger
}

// Report implements Reporter.
func (r *EventReporter) Report(svc *v1.Service, problems []Problem) {
	for _, p := range problems {
		if p.Panic != nil {
			r.Log.Error("recovered a panic; the Service is left out", "service", p.Service.String(), "err", p.Panic.Error(), "stack", string(p.Panic.Stack))
		} else {
			r.Log.Warn("refused part of a Service", "service", p.Service.String(), "reason", p.Reason, "message", p.Message)
		}
		if r.Recorder != nil {
			r.Recorder.Event(svc, v1.EventTypeWarning, p.Reason, p.Message)
		}
	}
}

// WaitForSync waits until synced returns true or ctx ends.
func WaitForSync(ctx context.Context, synced func() bool) error {
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return fmt.Errorf("informers did not sync: %w", ctx.Err())
	}
	return nil
}
