package portal

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// The Service CIDRs are the ranges cluster IPs are allocated from: the
// spec.cidrs of every networking.k8s.io/v1 ServiceCIDR object, as
// kube-proxy reads them, together with the ranges of Config.ServiceCIDRs
// (the agent's --service-cidr flag, the only source on an API server
// without the ServiceCIDR API). The Snapshot carries their union; the
// nft backend drops new connections to an address inside it that no
// Service holds. Endpoints are refused inside Config.ServiceCIDRs only:
// the union changes at run time, and re-checking every endpoint then
// would rebuild every Service.

// serviceCIDRResource is the ServiceCIDR API's resource name.
const serviceCIDRResource = "servicecidrs"

// SetServiceCIDR records a new or updated ServiceCIDR object. Ranges that
// do not parse are left out (the API server validates them).
func (t *Tracker) SetServiceCIDR(sc *networkingv1.ServiceCIDR) {
	var ps []netip.Prefix
	for _, s := range sc.Spec.CIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			ps = append(ps, p)
		}
	}
	t.mu.Lock()
	t.cidrObjects[sc.Name] = ps
	t.serviceCIDRsChangedLocked()
	t.mu.Unlock()
	t.notify()
}

// DeleteServiceCIDR records a deleted ServiceCIDR object.
func (t *Tracker) DeleteServiceCIDR(sc *networkingv1.ServiceCIDR) {
	t.mu.Lock()
	delete(t.cidrObjects, sc.Name)
	t.serviceCIDRsChangedLocked()
	t.mu.Unlock()
	t.notify()
}

// serviceCIDRsChangedLocked recomputes the union, and asks for a sync when
// it changed. Called with t.mu held.
func (t *Tracker) serviceCIDRsChangedLocked() {
	all := slices.Clone(t.cfg.ServiceCIDRs)
	for _, ps := range t.cidrObjects {
		all = append(all, ps...)
	}
	u := UnionCIDRs(all)
	if slices.Equal(u, t.serviceCIDRs) {
		return
	}
	t.serviceCIDRs = u
	if t.changed.IsZero() {
		t.changed = time.Now()
	}
}

// UnionCIDRs returns the ranges of ps as a sorted list of masked prefixes
// none of which holds another: two prefixes are either disjoint or one
// holds the other, so dropping the held ones leaves each address covered
// once. IPv4-mapped IPv6 prefixes are taken as IPv4; invalid ones are left out.
func UnionCIDRs(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() {
			if p.Bits() < 96 {
				continue // wider than the mapped range: not an IPv4 range
			}
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	// Wider prefixes first among equal addresses, so that a held prefix
	// always comes after the one holding it.
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	kept := out[:0]
	for _, p := range out {
		if n := len(kept); n > 0 && kept[n-1].Bits() <= p.Bits() && kept[n-1].Contains(p.Addr()) {
			continue
		}
		kept = append(kept, p)
	}
	return slices.Clip(kept)
}

// startServiceCIDRs watches ServiceCIDR objects into t, when asked to
// and the API server serves them. Without the API (before Kubernetes
// v1.33, where it became networking.k8s.io/v1) it logs so and returns a
// synced func that is always true: Config.ServiceCIDRs are then the only
// ranges.
func (s *Informers) startServiceCIDRs(ctx context.Context, t *Tracker) (func() bool, error) {
	if !s.ServiceCIDRs {
		return func() bool { return true }, nil
	}
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	served, err := s.servesServiceCIDRs()
	if err != nil {
		return nil, err
	}
	if !served {
		log.Warn("the API server has no ServiceCIDR API (networking.k8s.io/v1 servicecidrs); "+
			"only the --service-cidr ranges are dropped when unallocated", "service_cidrs", fmt.Sprint(t.cfg.ServiceCIDRs))
		return func() bool { return true }, nil
	}
	f := informers.NewSharedInformerFactoryWithOptions(s.Client, s.Resync, informers.WithTransform(TrimForCache))
	inf := f.Networking().V1().ServiceCIDRs().Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { withType(o, t.SetServiceCIDR) },
		UpdateFunc: func(_, o any) { withType(o, t.SetServiceCIDR) },
		DeleteFunc: func(o any) { withType(o, t.DeleteServiceCIDR) },
	})
	if err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	return reg.HasSynced, nil
}

// servesServiceCIDRs asks the API server's discovery whether it serves
// networking.k8s.io/v1 servicecidrs.
func (s *Informers) servesServiceCIDRs() (bool, error) {
	gv := networkingv1.SchemeGroupVersion.String()
	list, err := s.Client.Discovery().ServerResourcesForGroupVersion(gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", gv, err)
	}
	for _, r := range list.APIResources {
		if r.Name == serviceCIDRResource {
			return true, nil
		}
	}
	return false, nil
}
