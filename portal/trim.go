package portal

import (
	"k8s.io/apimachinery/pkg/api/meta"
)

// lastApplied is kubectl's copy of the whole object as last applied: often
// the largest part of a Service's metadata, and never read here.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// TrimForCache drops from an object what the model never reads, before
// the informer caches it: the managed fields (the server-side apply
// bookkeeping, about as large as the object itself) and kubectl's
// last-applied copy. At 10k Services with their EndpointSlices that is a
// large share of the agent's heap, on every node. Only for caches whose
// objects are never written back (the annotation would be lost): it is a
// cache.TransformFunc; objects it does not know pass unchanged.
func TrimForCache(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a[lastApplied] != "" {
			delete(a, lastApplied)
		}
	}
	return obj, nil
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
