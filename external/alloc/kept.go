package alloc

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/ipam"
)

// KeptPools names, for each address a Service keeps outside every pool of
// p, the pools it may have come from: the pool its annotation names, else
// every pool that admits the Service (its namespace and labels). A
// pool-picking advertisement keeps announcing such an address as long as
// it picks one of them (config.Announcer's Kept), so that shrinking a pool
// does not take a Service's address off the air (the Service has an
// IPOutsidePools event). Without advertisements nothing is needed: every
// address is announced.
func KeptPools(p *config.Parsed, services []*corev1.Service) map[netip.Addr][]string {
	if !p.Advertises() {
		return nil
	}
	var out map[netip.Addr][]string
	for _, svc := range services {
		if !Managed(p, svc) {
			continue
		}
		for _, ip := range StatusIPs(svc) {
			if slices.ContainsFunc(p.IPAMPools, func(pl ipam.Pool) bool { return pl.Contains(ip) }) {
				continue
			}
			_, named, _ := annotation(svc, AnnotationAddressPool)
			named = strings.TrimSpace(named)
			for i := range p.IPAMPools {
				pl := &p.IPAMPools[i]
				if named != "" && pl.Name != named || named == "" && !pl.Admits(svc.Namespace, svc.Labels) {
					continue
				}
				if out == nil {
					out = map[netip.Addr][]string{}
				}
				if !slices.Contains(out[ip], pl.Name) {
					out[ip] = append(out[ip], pl.Name)
				}
			}
		}
	}
	return out
}
