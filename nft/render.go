package nft

import (
	"net/netip"
	"slices"

	"github.com/onehop/onehop/portal"
)

// chainBody is the content of one per-portal chain, in a form that can be
// compared with what was applied before.
type chainBody struct {
	// mark sets the masquerade bit (external traffic that needs its own
	// chain).
	mark bool
	// endpoints are DNAT targets, picked at random; empty with gotoChain set
	// means the chain only marks and continues there.
	endpoints []netip.AddrPort
	gotoChain string
}

func (b chainBody) equal(o chainBody) bool {
	return b.mark == o.mark && b.gotoChain == o.gotoChain && slices.Equal(b.endpoints, o.endpoints)
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
	// elems are owned by this portal alone (another portal claiming the
	// same key is a conflict).
	elems []elem
	// shared are plain-set elements several portals may need (a cluster IP
	// with several ports, an endpoint in several Services): reference counted.
	shared []elem
}

// render computes the kernel objects for one portal. It is pure.
//
// Traffic to a cluster IP goes to the portal's svc chain, which DNATs to an
// endpoint. External traffic under the Cluster policy goes there too, and is
// marked for masquerade by the services chain through the ext-marks and
// np-marks sets, so that it needs no chain of its own.
func render(p *portal.Portal) *objects {
	o := &objects{chains: map[string]chainBody{}}
	k := p.Key
	f := k.Family
	svcChain := portalChain(kindService, k)

	internal := p.ClusterEndpoints
	if p.InternalLocal {
		internal = p.LocalEndpoints
	}
	if len(internal) > 0 {
		o.chains[svcChain] = chainBody{endpoints: internal}
	}
	for _, ip := range p.ClusterIPs {
		o.elems = append(o.elems, target(entryClusterIP, setVIPs(f), setNoEndpoints(f), vipKey(ip, k.Protocol, p.Port), svcChain, len(internal) > 0))
		o.shared = append(o.shared, elem{set: setClusterIPs(f), key: string(addrBytes(ip))})
	}

	if p.HasExternal() {
		external := p.ClusterEndpoints
		extChain := svcChain
		if p.InternalLocal && len(external) > 0 {
			// The svc chain only reaches local endpoints; external traffic
			// under the Cluster policy needs all of them.
			extChain = portalChain(kindAll, k)
			o.chains[extChain] = chainBody{endpoints: external}
		}
		hasEps := len(external) > 0
		addExt := func(entry string, ip netip.Addr) {
			key := vipKey(ip, k.Protocol, p.Port)
			o.elems = append(o.elems, target(entry, setVIPs(f), setNoEndpoints(f), key, extChain, hasEps))
			if hasEps {
				o.elems = append(o.elems, elem{set: setExtMarks(f), key: string(key)})
			}
		}
		for _, ip := range p.ExternalIPs {
			addExt(entryExternalIP, ip)
		}
		for _, ip := range p.LoadBalancerIPs {
			addExt(entryLoadBalancer, ip)
		}
		if p.NodePort != 0 {
			key := protoPortKey(k.Protocol, p.NodePort)
			o.elems = append(o.elems, target(entryNodePort, setNodePorts(f), setNoEndpointsNP(f), key, extChain, hasEps))
			if hasEps {
				o.elems = append(o.elems, elem{set: setNodePortMarks(f), key: string(key)})
			}
		}
	}
	var hairpin []netip.Addr
	for _, ep := range p.ClusterEndpoints {
		hairpin = append(hairpin, ep.Addr())
	}
	for _, ep := range p.LocalEndpoints {
		hairpin = append(hairpin, ep.Addr())
	}
	slices.SortFunc(hairpin, netip.Addr.Compare)
	for _, a := range slices.Compact(hairpin) {
		o.shared = append(o.shared, elem{set: setHairpin(f), key: string(pairKey(a, a))})
	}
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
