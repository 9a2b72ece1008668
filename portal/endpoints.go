package portal

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// candidate is one usable endpoint of a Service port.
type candidate struct {
	addr        netip.AddrPort
	ready       bool
	serving     bool
	terminating bool
	local       bool
	// nodeHints and zoneHints are the endpoint's hints.forNodes and
	// hints.forZones (topology.go).
	nodeHints []string
	zoneHints []string
}

// endpoints fills p.ClusterEndpoints, p.LocalEndpoints and p.Serving from
// the slices, with kube-proxy's rules: ready endpoints; when none is
// ready, serving terminating ones. Topology hints (topology.go) narrow the
// ready endpoints of the Cluster policy, never the Local policy's, and
// only when the port uses the Cluster policy at all: a port with
// internalTrafficPolicy: Local and no external way in does not. Serving
// is every ready or serving endpoint, narrowed by none of these.
func (b *builder) endpoints(p *Portal, sp *v1.ServicePort, eslices []*discovery.EndpointSlice) {
	cands := b.candidates(p, sp, eslices)
	ready := func(c candidate) bool { return c.ready }
	terminating := func(c candidate) bool { return c.serving && c.terminating }

	node, zone := b.cfg.NodeName, b.cfg.NodeZone
	var topo topology
	if !p.InternalLocal || p.HasExternal() {
		topo = chooseTopology(cands, node, zone, asksForTopology(b.svc))
	} else if asksForTopology(b.svc) {
		topo.why = "none: internalTrafficPolicy Local serves this node's endpoints only"
	}
	p.Topology = topo.why
	cluster := pick(cands, func(c candidate) bool { return ready(c) && topo.allows(c, node, zone) })
	// No ready endpoint anywhere (the mode would have been none had there
	// been one): serving terminating ones, whatever their hints.
	if len(cluster) == 0 {
		cluster = pick(cands, terminating)
	}
	local := pick(cands, func(c candidate) bool { return c.local && ready(c) })
	if len(local) == 0 {
		local = pick(cands, func(c candidate) bool { return c.local && terminating(c) })
	}
	p.ClusterEndpoints = cluster
	if p.ExternalLocal || p.InternalLocal {
		p.LocalEndpoints = local
	}
	p.Serving = servingOf(cands, cluster)
	p.Hairpin = hairpin(cands, p.ClusterEndpoints, p.LocalEndpoints)
	if p.ExternalLocal || p.InternalLocal || p.HealthCheckNodePort != 0 {
		readyAddrs := map[netip.Addr]bool{}
		for _, c := range cands {
			if c.local && c.ready {
				readyAddrs[c.addr.Addr()] = true
			}
		}
		p.LocalReady = len(readyAddrs)
	}
}

// servingOf returns the candidates that are ready or serving. They hold
// cluster, in the same order: when they are as many, they are cluster,
// and its array is shared rather than a copy kept beside it for every
// Service.
func servingOf(cands []candidate, cluster []netip.AddrPort) []netip.AddrPort {
	serving := func(c candidate) bool { return c.ready || c.serving }
	n := 0
	for _, c := range cands {
		if serving(c) {
			n++
		}
	}
	if n == len(cluster) {
		return cluster
	}
	return pick(cands, serving)
}

// hairpin returns the sorted, distinct addresses of the local candidates
// that are among the chosen endpoints.
func hairpin(cands []candidate, chosen ...[]netip.AddrPort) []netip.Addr {
	picked := map[netip.AddrPort]bool{}
	for _, eps := range chosen {
		for _, ep := range eps {
			picked[ep] = true
		}
	}
	var out []netip.Addr
	for _, c := range cands {
		if c.local && picked[c.addr] {
			out = append(out, c.addr.Addr())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func pick(cands []candidate, keep func(candidate) bool) []netip.AddrPort {
	var out []netip.AddrPort
	for _, c := range cands {
		if keep(c) {
			out = append(out, c.addr)
		}
	}
	return out
}

func (b *builder) candidates(p *Portal, sp *v1.ServicePort, eslices []*discovery.EndpointSlice) []candidate {
	want := discovery.AddressTypeIPv4
	if p.Key.Family == IPv6 {
		want = discovery.AddressTypeIPv6
	}
	var out []candidate
	seen := map[netip.AddrPort]int{}
	for _, es := range eslices {
		if es.AddressType != want {
			continue
		}
		port, ok := slicePort(es, sp)
		if !ok {
			continue
		}
		for i := range es.Endpoints {
			ep := &es.Endpoints[i]
			// As kube-proxy: an unset condition is true, except
			// terminating. publishNotReadyAddresses is the EndpointSlice
			// controller's business (it writes such endpoints ready).
			c := candidate{
				ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
				serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
				terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
				local:       ep.NodeName != nil && *ep.NodeName == b.cfg.NodeName && b.cfg.NodeName != "",
			}
			if ep.Hints != nil {
				for _, n := range ep.Hints.ForNodes {
					c.nodeHints = append(c.nodeHints, n.Name)
				}
				for _, z := range ep.Hints.ForZones {
					c.zoneHints = append(c.zoneHints, z.Name)
				}
			}
			for _, s := range ep.Addresses {
				a, ok := parseAddr(s)
				if !ok || FamilyOf(a) != p.Key.Family {
					b.problem(ReasonInvalidEndpoint, "EndpointSlice %s: endpoint %q is not an %s address", es.Name, s, p.Key.Family)
					continue
				}
				if !servable(a) {
					b.problem(ReasonInvalidEndpoint, "EndpointSlice %s: endpoint %s is a loopback, link-local or multicast address; refused", es.Name, a)
					continue
				}
				if inAny(b.cfg.ServiceCIDRs, a) {
					b.problem(ReasonInvalidEndpoint, "EndpointSlice %s: endpoint %s is inside the service CIDR; refused", es.Name, a)
					continue
				}
				c.addr = netip.AddrPortFrom(a, port)
				if j, dup := seen[c.addr]; dup {
					// The same endpoint twice: in two slices during a move,
					// or a new pod given a terminating one's address. As
					// kube-proxy, a later entry wins unless it is
					// terminating.
					if !c.terminating {
						out[j] = c
					}
					break
				}
				seen[c.addr] = len(out)
				out = append(out, c)
				break // kube-proxy uses an endpoint's first address only
			}
		}
	}
	slices.SortFunc(out, func(x, y candidate) int { return x.addr.Compare(y.addr) })
	return out
}

// slicePort finds the target port of sp in es: the slice port with the same
// name and protocol. A slice port without a name is ignored, as kube-proxy
// ignores it; the API server never stores one (it defaults the name to
// ""), so only the unnamed Service port's slice port, "" written or not,
// reaches the model.
func slicePort(es *discovery.EndpointSlice, sp *v1.ServicePort) (uint16, bool) {
	proto := sp.Protocol
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	for _, p := range es.Ports {
		if p.Name == nil {
			continue
		}
		pp := v1.ProtocolTCP
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		if *p.Name != sp.Name || pp != proto || p.Port == nil {
			continue
		}
		if *p.Port <= 0 || *p.Port > 65535 {
			return 0, false
		}
		return uint16(*p.Port), true
	}
	return 0, false
}
