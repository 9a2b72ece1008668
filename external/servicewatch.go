package external

import "github.com/onehop/onehop/portal"

// Option changes how New builds a node's hook.
type Option func(*Hook)

// WithServiceWatch makes the hook read Services and EndpointSlices from w,
// the watch the agent's model reads too (portal.Informers.Watch), instead
// of watching them a second time: one watch event and one cached copy per
// object for both. The hook reads of them only what w's cache keeps
// (portal.TrimForSharedCache: of a Service its addresses, type, class,
// ports, traffic policy, selector, labels and onehop's annotations; of an
// EndpointSlice its Service's name and its endpoints' readiness and node),
// and writes a Service's status with a patch of its load-balancer ingress
// alone, never the cached object. Without it (`agent controller`) the hook
// keeps its own informers.
func WithServiceWatch(w *portal.ServiceWatch) Option {
	return func(h *Hook) { h.watch = w }
}

// Idle reports whether Run will watch nothing, as the hook is configured
// now (AddProvider changes it): nothing in the configuration is for this
// role. An agent shares its model's watch with the hook only when the hook
// uses it.
func (h *Hook) Idle() bool { return h.idle() }
