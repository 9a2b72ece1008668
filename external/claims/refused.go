package external

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/portal"
)

// refusedExternal returns, per Service, the spec.externalIPs the registry
// gives to someone else (another tenant's load-balancer IP, external IP or
// pod), sorted.
func (o *ownership) refusedExternal() map[portal.ServiceKey][]netip.Addr {
	out := map[portal.ServiceKey][]netip.Addr{}
	for _, r := range o.refusals {
		svc, ok := r.obj.(*corev1.Service)
		if !ok || r.reason != ReasonExternalIPConflict {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimSpace(r.ip))
		if err != nil {
			continue
		}
		k := portal.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
		if !slices.Contains(out[k], a.Unmap()) {
			out[k] = append(out[k], a.Unmap())
		}
	}
	for _, ips := range out {
		slices.SortFunc(ips, netip.Addr.Compare)
	}
	return out
}

// RefusedExternalIPs returns, per Service, the spec.externalIPs this
// node's dataplane must not serve because the registry gives the address
// to someone else: a refused claim is not announced, and it is not served
// either, so that a Service in one namespace cannot receive traffic sent to
// another's address on the nodes that announce it. ok is false until the
// registry has run over complete listings; the dataplane's first sync
// waits for it. A hook with nothing to do in its role runs no registry
// and refuses nothing here.
func (h *Hook) RefusedExternalIPs() (refused map[portal.ServiceKey][]netip.Addr, ok bool) {
	if h.idle() {
		return nil, true // this role watches nothing (Run): no registry here
	}
	h.regMu.Lock()
	defer h.regMu.Unlock()
	if h.refused == nil {
		return nil, false
	}
	return maps.Clone(h.refused), true
}

// RefusedExternalIPsChanged is signalled when RefusedExternalIPs changed.
func (h *Hook) RefusedExternalIPsChanged() <-chan struct{} { return h.refusedChanged }

// noteRefused records the refused external IPs of the registry's latest
// answer, over complete listings (synced); called with h.regMu held.
func (h *Hook) noteRefused(own *ownership, synced bool) {
	if !synced {
		return
	}
	now := own.refusedExternal()
	if h.refused != nil && maps.EqualFunc(now, h.refused, slices.Equal) {
		return
	}
	h.refused = now
	select {
	case h.refusedChanged <- struct{}{}:
	default:
	}
}
