package claims

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/portal"
)

// RefusedExternal returns, per Service, the spec.externalIPs the registry
// gives to someone else (another tenant's load-balancer IP, external IP or
// pod), sorted.
func (o *Ownership) RefusedExternal() map[portal.ServiceKey][]netip.Addr {
	out := map[portal.ServiceKey][]netip.Addr{}
	for _, r := range o.Refusals {
		svc, ok := r.Obj.(*corev1.Service)
		if !ok || r.Reason != ReasonExternalIPConflict {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimSpace(r.IP))
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
