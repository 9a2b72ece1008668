package nft

import (
	"net/netip"
	"slices"

	"github.com/onehop/onehop/portal"
)

// chainBody is the content of one per-portal chain, in a form that can be
// compared with what was applied before.
type chainBody struct {
	// masqOutside jumps to masq-outside first (cluster-IP traffic from
	// outside the cluster CIDRs is masqueraded).
	masqOutside bool
	// mark sets the masquerade bit (external traffic, Cluster policy).
	mark bool
	// endpoints are DNAT targets, picked at random; empty with gotoChain set
	// means the chain only marks and continues there.
	endpoints []netip.AddrPort
	gotoChain string
}

func (b chainBody) equal(o chainBody) bool {
	return b.masqOutside == o.masqOutside && b.mark == o.mark && b.gotoChain == o.gotoChain &&
		slices.Equal(b.endpoints, o.endpoints)
}

// elem is one element of a named set or map; chain is the goto target of a
// verdict map element ("" for plain sets).
type elem struct {
	set     string
	key     string // encoded key bytes
	chain   string
	comment string // "<entry kind> <portal chain>", read back by dump-rules
}

func (e elem) id() string { return e.set + "\x00" + e.key }

// objects is everything one portal puts into the table.
type objects struct {
	chains map[string]chainBody
	elems  []elem
	// hairpin are endpoint addresses that need hairpin masquerade.
	hairpin []netip.Addr
}

// render computes the kernel objects for one portal. It is pure.
func render(p *portal.Portal) *objects {
	o := &objects{chains: map[string]chainBody{}}
	k := p.Key
	f := k.Family
	svcChain := portalChain(kindService, k)
	extChain := portalChain(kindExternal, k)

	internal := p.ClusterEndpoints
	if p.InternalLocal {
		internal = p.LocalEndpoints
	}
	if len(internal) > 0 {
		o.chains[svcChain] = chainBody{masqOutside: true, endpoints: internal}
	}
	for _, ip := range p.ClusterIPs {
		o.elems = append(o.elems, target(entryClusterIP, setVIPs(f), setNoEndpoints(f), vipKey(ip, k.Protocol, p.Port), svcChain, len(internal) > 0))
	}

	if p.HasExternal() {
		external := p.ClusterEndpoints
		hasEps := len(external) > 0
		if hasEps {
			if p.InternalLocal {
				// The cluster-IP chain only reaches local endpoints; external
				// traffic under the Cluster policy needs all of them.
				all := portalChain(kindAll, k)
				o.chains[all] = chainBody{endpoints: external}
				o.chains[extChain] = chainBody{mark: true, gotoChain: all}
			} else {
				o.chains[extChain] = chainBody{mark: true, gotoChain: svcChain}
			}
		}
		for _, ip := range p.ExternalIPs {
			o.elems = append(o.elems, target(entryExternalIP, setVIPs(f), setNoEndpoints(f), vipKey(ip, k.Protocol, p.Port), extChain, hasEps))
		}
		for _, ip := range p.LoadBalancerIPs {
			o.elems = append(o.elems, target(entryLoadBalancer, setVIPs(f), setNoEndpoints(f), vipKey(ip, k.Protocol, p.Port), extChain, hasEps))
		}
		if p.NodePort != 0 {
			o.elems = append(o.elems, target(entryNodePort, setNodePorts(f), setNoEndpointsNP(f), protoPortKey(k.Protocol, p.NodePort), extChain, hasEps))
		}
	}
	for _, ep := range p.ClusterEndpoints {
		o.hairpin = append(o.hairpin, ep.Addr())
	}
	for _, ep := range p.LocalEndpoints {
		o.hairpin = append(o.hairpin, ep.Addr())
	}
	slices.SortFunc(o.hairpin, netip.Addr.Compare)
	o.hairpin = slices.Compact(o.hairpin)
	return o
}

// target is the element that sends key to chain, or to the reject chain
// when there are no endpoints.
func target(entry, set, noepSet string, key []byte, chain string, hasEndpoints bool) elem {
	comment := entry + " " + chain
	if hasEndpoints {
		return elem{set: set, key: string(key), chain: chain, comment: comment}
	}
	return elem{set: noepSet, key: string(key), chain: chainReject, comment: comment}
}

// Kinds of ways into a portal, as dump-rules names them.
const (
	entryClusterIP    = "cluster-ip"
	entryExternalIP   = "external-ip"
	entryLoadBalancer = "load-balancer"
	entryNodePort     = "node-port"
)
