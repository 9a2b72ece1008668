package portal

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Skip reports why onehop does not serve svc at all ("" when it does).
func (c *Config) Skip(svc *v1.Service) string {
	if name, ok := svc.Labels[LabelServiceProxyName]; ok && name != c.ServiceProxyName {
		return "served by proxy " + name
	} else if !ok && c.ServiceProxyName != "" {
		return "not labelled for proxy " + c.ServiceProxyName
	}
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return "ExternalName"
	}
	if svc.Spec.ClusterIP == v1.ClusterIPNone || svc.Spec.ClusterIP == "" {
		return "headless"
	}
	return ""
}

// Build turns a Service and its EndpointSlices into desired portals. It
// never fails: bad values are left out and reported as Problems. It returns
// nil when the Service is not served (headless, ExternalName, another
// proxy's), and nil with a ServiceTooLarge Problem when it is over the
// Limits.
func (c *Config) Build(svc *v1.Service, eslices []*discovery.EndpointSlice) (*Service, []Problem) {
	if c.Skip(svc) != "" {
		return nil, nil
	}
	if p := c.overLimits(svc); p != nil {
		return nil, []Problem{*p}
	}
	key := ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
	b := builder{cfg: c, svc: svc, key: key}
	out := &Service{Key: key}
	sched := svc.Annotations[AnnotationScheduler]
	if sched != "" && !slices.Contains(ipvsSchedulers, sched) {
		b.problem(ReasonInvalidScheduler, "annotation %s: unknown IPVS scheduler %q (want one of %v); using the default", AnnotationScheduler, sched, ipvsSchedulers)
		sched = ""
	}
	bal := b.balancing()
	vips := b.clusterIPs()
	ext := b.externalIPs()
	lbs := b.ingressIPs()
	// Every VIP-mode ingress IP of a family, also one programmed as the
	// cluster or an external IP: the sources a node's own connection to a
	// VIP may loop back with.
	vipSources := map[Family][]netip.Addr{IPv4: slices.Clone(lbs[IPv4]), IPv6: slices.Clone(lbs[IPv6])}
	// An address is one way in: listed twice, it is programmed once, as
	// the first of cluster, external and load-balancer IP.
	for f := range ext {
		ext[f] = b.without(ext[f], vips[f], ReasonExternalIPRefused, "external IP %s is the Service's cluster IP; not programmed again")
	}
	for f := range lbs {
		lbs[f] = b.without(lbs[f], slices.Concat(vips[f], ext[f]), ReasonInvalidIngressIP, "load-balancer IP %s is also the Service's cluster or external IP; programmed once, as that")
	}
	// Parsed once: every port of the Service shares them.
	ranges := map[Family][]netip.Prefix{}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		ranges[IPv4], ranges[IPv6] = b.sourceRanges()
		for f := range ranges {
			ranges[f] = b.cfg.withNodeLoopback(ranges[f], vipSources[f])
		}
	}
	type protoPort struct {
		proto Protocol
		port  int32
	}
	names := map[string]bool{}          // name/protocol of the ports taken
	ports := map[protoPort]string{}     // port -> the Service port's name
	nodePorts := map[protoPort]string{} // node port -> the Service port's name
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		proto, ok := ParseProtocol(string(sp.Protocol))
		if sp.Protocol == "" {
			proto, ok = TCP, true
		}
		if !ok {
			b.problem(ReasonInvalidPort, "port %q: unknown protocol %q", sp.Name, sp.Protocol)
			continue
		}
		if sp.Port <= 0 || sp.Port > 65535 {
			b.problem(ReasonInvalidPort, "port %q: %d is not a valid port", sp.Name, sp.Port)
			continue
		}
		// The apiserver refuses these duplicates; one that slipped past
		// would give two portals one key, or one address and port.
		if names[sp.Name+"/"+proto.String()] {
			b.problem(ReasonInvalidPort, "port %q/%s is listed twice; only the first is programmed", sp.Name, proto)
			continue
		}
		if other, dup := ports[protoPort{proto, sp.Port}]; dup {
			b.problem(ReasonInvalidPort, "port %q: %d/%s is already port %q of this Service; not programmed", sp.Name, sp.Port, proto, other)
			continue
		}
		names[sp.Name+"/"+proto.String()] = true
		ports[protoPort{proto, sp.Port}] = sp.Name
		nodePort := uint16(0)
		if svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			if sp.NodePort > 0 && sp.NodePort <= 65535 {
				nodePort = uint16(sp.NodePort)
			} else if sp.NodePort != 0 {
				b.problem(ReasonInvalidPort, "port %q: node port %d is not a valid port", sp.Name, sp.NodePort)
			}
		}
		if other, dup := nodePorts[protoPort{proto, int32(nodePort)}]; nodePort != 0 && dup {
			b.problem(ReasonInvalidPort, "port %q: node port %d/%s is already used by port %q of this Service; not programmed", sp.Name, nodePort, proto, other)
			nodePort = 0
		} else if nodePort != 0 {
			nodePorts[protoPort{proto, int32(nodePort)}] = sp.Name
		}
		for _, f := range []Family{IPv4, IPv6} {
			if len(vips[f]) == 0 {
				continue
			}
			p := &Portal{
				Key:             PortKey{Service: key, Port: sp.Name, Protocol: proto, Family: f},
				Port:            uint16(sp.Port),
				ClusterIPs:      vips[f],
				NodePort:        nodePort,
				ExternalIPs:     ext[f],
				LoadBalancerIPs: lbs[f],
				ExternalLocal:   svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal && (nodePort != 0 || len(ext[f]) > 0 || len(lbs[f]) > 0),
				InternalLocal:   svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
				Scheduler:       sched,
				Balancing:       bal,
			}
			if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
				p.SourceRanges = ranges[f]
				// Served whether or not the family has a way in (no node
				// ports, no VIP-mode ingress IP yet), as by kube-proxy.
				if svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal && svc.Spec.HealthCheckNodePort > 0 && svc.Spec.HealthCheckNodePort <= 65535 {
					p.HealthCheckNodePort = uint16(svc.Spec.HealthCheckNodePort)
				}
			}
			if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
				p.Affinity.TimeoutSeconds = uint32(v1.DefaultClientIPServiceAffinitySeconds)
				if cfg := svc.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil && *cfg.ClientIP.TimeoutSeconds > 0 {
					p.Affinity.TimeoutSeconds = uint32(*cfg.ClientIP.TimeoutSeconds)
				}
			}
			b.endpoints(p, sp, eslices)
			out.Portals = append(out.Portals, p)
		}
	}
	sortPortals(out.Portals)
	return out, b.problems
}

func sortPortals(ps []*Portal) {
	slices.SortFunc(ps, func(a, b *Portal) int { return strings.Compare(a.Key.String(), b.Key.String()) })
}

type builder struct {
	cfg      *Config
	svc      *v1.Service
	key      ServiceKey
	problems []Problem
}

func (b *builder) problem(reason, format string, args ...any) {
	b.problems = append(b.problems, Problem{Service: b.key, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

func parseAddr(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Zone() != "" || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func (b *builder) clusterIPs() map[Family][]netip.Addr {
	out := map[Family][]netip.Addr{}
	ips := b.svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{b.svc.Spec.ClusterIP}
	}
	for i, s := range ips {
		a, ok := parseAddr(s)
		if !ok {
			b.problem(ReasonInvalidClusterIP, "cluster IP %q is not an IP address", s)
			continue
		}
		f := FamilyOf(a)
		if i < len(b.svc.Spec.IPFamilies) {
			want := IPv4
			if b.svc.Spec.IPFamilies[i] == v1.IPv6Protocol {
				want = IPv6
			}
			if want != f {
				b.problem(ReasonInvalidClusterIP, "cluster IP %s is not of family %s", a, b.svc.Spec.IPFamilies[i])
				continue
			}
		}
		if len(out[f]) > 0 {
			b.problem(ReasonInvalidClusterIP, "more than one %s cluster IP (%s)", f, a)
			continue
		}
		out[f] = append(out[f], a)
	}
	return out
}

func (b *builder) externalIPs() map[Family][]netip.Addr {
	out := map[Family][]netip.Addr{}
	for _, s := range b.svc.Spec.ExternalIPs {
		a, ok := parseAddr(s)
		if !ok {
			b.problem(ReasonExternalIPRefused, "external IP %q is not an IP address", s)
			continue
		}
		if !servable(a) {
			b.problem(ReasonExternalIPRefused, "external IP %s is a loopback, link-local or multicast address; not programmed", a)
			continue
		}
		if !inAny(b.cfg.ExternalIPCIDRs, a) {
			b.problem(ReasonExternalIPRefused, "external IP %s is outside --external-ip-cidrs %v; not programmed", a, b.cfg.ExternalIPCIDRs)
			continue
		}
		out[FamilyOf(a)] = appendUnique(out[FamilyOf(a)], a)
	}
	return out
}

func (b *builder) ingressIPs() map[Family][]netip.Addr {
	out := map[Family][]netip.Addr{}
	if b.svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return out
	}
	for _, ing := range b.svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress: nothing to program
		}
		if ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy {
			continue // the load balancer proxies; traffic arrives for the node
		}
		a, ok := parseAddr(ing.IP)
		if !ok {
			b.problem(ReasonInvalidIngressIP, "load-balancer ingress IP %q is not an IP address", ing.IP)
			continue
		}
		if !servable(a) {
			b.problem(ReasonInvalidIngressIP, "load-balancer ingress IP %s is a loopback, link-local or multicast address; not programmed", a)
			continue
		}
		out[FamilyOf(a)] = appendUnique(out[FamilyOf(a)], a)
	}
	return out
}

// sourceRanges parses loadBalancerSourceRanges into the IPv4 and the IPv6
// ones, each sorted and without duplicates.
func (b *builder) sourceRanges() (v4, v6 []netip.Prefix) {
	out := map[Family][]netip.Prefix{}
	for _, s := range b.svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			b.problem(ReasonInvalidIngressIP, "loadBalancerSourceRanges entry %q is not a CIDR", s)
			continue
		}
		f := FamilyOf(p.Addr())
		out[f] = append(out[f], p.Masked())
	}
	for f, ps := range out {
		slices.SortFunc(ps, comparePrefix)
		out[f] = slices.Compact(ps)
	}
	return out[IPv4], out[IPv6]
}

// withNodeLoopback returns ranges with the load-balancer IPs lbs added as
// single addresses when one of the ranges holds this node's address of
// their family, as kube-proxy does: a load-balancer IP is often a local
// address of the node, and the node's own connection to it then loops
// back with the IP itself as its source. ranges is returned unchanged
// otherwise, and is never modified.
func (c *Config) withNodeLoopback(ranges []netip.Prefix, lbs []netip.Addr) []netip.Prefix {
	if len(ranges) == 0 || len(lbs) == 0 {
		return ranges
	}
	node := slices.IndexFunc(c.NodeIPs, func(a netip.Addr) bool {
		return FamilyOf(a) == FamilyOf(lbs[0]) && inAny(ranges, a)
	})
	if node < 0 {
		return ranges
	}
	out := slices.Clone(ranges)
	for _, a := range lbs {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out)
}

// comparePrefix orders prefixes by address, then length.
func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// servable reports whether a may be an external or load-balancer IP or an
// endpoint. The apiserver refuses loopback, link-local and multicast
// addresses there: traffic to them would reach the node itself or its link
// (a cloud's metadata server at 169.254.169.254, for one), not a Service.
func servable(a netip.Addr) bool {
	return !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() && !a.IsMulticast()
}

// without returns as without the addresses in taken, reporting each.
func (b *builder) without(as, taken []netip.Addr, reason, format string) []netip.Addr {
	return slices.DeleteFunc(as, func(a netip.Addr) bool {
		if slices.Contains(taken, a) {
			b.problem(reason, format, a)
			return true
		}
		return false
	})
}

func appendUnique(as []netip.Addr, a netip.Addr) []netip.Addr {
	if slices.Contains(as, a) {
		return as
	}
	as = append(as, a)
	slices.SortFunc(as, netip.Addr.Compare)
	return as
}
