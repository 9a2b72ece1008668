package portal

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// lastApplied is kubectl's copy of the whole object as last applied: often
// the largest part of a Service's metadata, and never read here.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// TrimForCache drops from an object what the model never reads, before
// the informer caches it: the managed fields (the server-side apply
// bookkeeping, about as large as the object itself), kubectl's
// last-applied copy, and for Services and EndpointSlices the fields below.
// At 10k Services with their EndpointSlices the caches are most of the
// agent's heap, on every node. Only for caches whose objects are never
// written back (what is dropped would be lost): it is a
// cache.TransformFunc; objects it does not know pass unchanged.
func TrimForCache(obj any) (any, error) { return trim(obj, false) }

// TrimForSharedCache is TrimForCache for a ServiceWatch, whose cache the
// cloud hook reads too: it keeps the Service selector, which the hook's
// load-balancer IP sharing compares (Local Services share an IP only when
// they select the same pods).
func TrimForSharedCache(obj any) (any, error) { return trim(obj, true) }

func trim(obj any, keepSelector bool) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a[lastApplied] != "" {
			delete(a, lastApplied)
		}
		m.SetOwnerReferences(nil)
	}
	switch o := obj.(type) {
	case *discovery.EndpointSlice:
		trimSlice(o)
	case *v1.Service:
		// The selector is the EndpointSlice controller's business; the
		// proxy reads the slices. Conditions are written by controllers.
		if !keepSelector {
			o.Spec.Selector = nil
		}
		o.Status.Conditions = nil
	}
	return obj, nil
}

// sliceLabels are the labels of an EndpointSlice that are kept: its
// Service's name, and the two the proxy selects by (a ServiceWatch selects
// after the cache, not in the request).
var sliceLabels = [...]string{LabelServiceName, LabelServiceProxyName, LabelHeadless}

// trimSlice keeps of an EndpointSlice what the model reads (addresses,
// conditions, node name, topology hints, ports, the labels of sliceLabels and
// the trigger-time annotation) in as little memory as it takes.
func trimSlice(es *discovery.EndpointSlice) {
	n := 0
	for _, k := range sliceLabels {
		if _, ok := es.Labels[k]; ok {
			n++
		}
	}
	if n < len(es.Labels) {
		kept := make(map[string]string, n)
		for _, k := range sliceLabels {
			if v, ok := es.Labels[k]; ok {
				kept[k] = v
			}
		}
		es.Labels = kept
	}
	if t, ok := es.Annotations[v1.EndpointsLastChangeTriggerTime]; ok && len(es.Annotations) > 1 {
		es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: t}
	} else if !ok {
		es.Annotations = nil
	}
	// The decoder grows the list by appending: a copy of the right length
	// gives back the unused capacity.
	eps := make([]discovery.Endpoint, len(es.Endpoints))
	for i, ep := range es.Endpoints {
		ep.TargetRef, ep.Hostname, ep.DeprecatedTopology, ep.Zone = nil, nil, nil, nil
		eps[i] = ep
	}
	es.Endpoints = eps
}

// TrimManagedFields drops only the managed fields: for caches whose
// objects may be written back (an update that omits them leaves the
// server's as they are).
func TrimManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
