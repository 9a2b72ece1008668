package portal

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// SetRefusedExternalIPs tells the model which spec.externalIPs of each
// Service are held by someone else (the cloud hook's registry decides: one
// owner per address across Services, load-balancer IPs and pods). Those are
// left out of the Service's portals, on every node, so that a claim
// refused by the registry is neither announced nor served. The refusal
// itself is reported by the registry, not here. Services whose refused
// set changed are rebuilt.
func (t *Tracker) SetRefusedExternalIPs(refused map[ServiceKey][]netip.Addr) {
	t.mu.Lock()
	changed := false
	for k := range t.refusedExt {
		if _, ok := refused[k]; !ok {
			t.markLocked(k)
			changed = true
		}
	}
	for k, ips := range refused {
		if !slices.Equal(t.refusedExt[k], ips) {
			t.markLocked(k)
			changed = true
		}
	}
	t.refusedExt = maps.Clone(refused)
	t.mu.Unlock()
	if changed {
		t.notify()
	}
}

// withoutRefused returns svc without the external IPs refused to it (svc
// itself when none is). Called with t.mu held.
func (t *Tracker) withoutRefused(k ServiceKey, svc *v1.Service) *v1.Service {
	refused := t.refusedExt[k]
	if len(refused) == 0 || len(svc.Spec.ExternalIPs) == 0 {
		return svc
	}
	keep := make([]string, 0, len(svc.Spec.ExternalIPs))
	for _, s := range svc.Spec.ExternalIPs {
		if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil && slices.Contains(refused, a.Unmap()) {
			continue
		}
		keep = append(keep, s)
	}
	c := *svc
	c.Spec.ExternalIPs = keep
	return &c
}
