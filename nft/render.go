package nft

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/dataplane"

	"github.com/onehop/onehop/portal"
)

// chainBody is the content of one per-portal chain, in a form that can be
// compared with what was applied before. Its rules, in order:
// shortCircuit (traffic from pods and the node goes there instead); DNAT
// to one of endpoints, with ClientIP affinity when affinity > 0, by
// Maglev consistent hashing when maglev (maglev.go); drop when
// dropIfEmpty and there are no endpoints.
type chainBody struct {
	family       portal.Family
	shortCircuit string
	endpoints    []netip.AddrPort
	affinity     uint32 // seconds
	dropIfEmpty  bool
	// maglev: the pick hashes the 5-tuple into a Maglev table. Never set
	// with affinity, whose chains remember a client's endpoint and pick
	// a new client's at random.
	maglev bool
	// topology is the portal's Topology, on the chain that holds its
	// Cluster-policy endpoints: its rules' tag carries it for dump-rules.
	topology string
}

// usesEndpointMap: the chain picks its endpoints from the family's
// endpoint maps (numgen random mod N), one element per endpoint, so that
// a changed endpoint is an element update, which the kernel applies
// without validating the whole table as it does for a new rule. Also with
// one endpoint: a one-replica Service whose pod is replaced is the most
// common change there is. Chains with affinity pick in their own rules.
func (b chainBody) usesEndpointMap() bool { return len(b.endpoints) >= 1 && b.affinity == 0 }

func (b chainBody) equal(o chainBody) bool {
	return b.sameRules(o) && slices.Equal(b.endpoints, o.endpoints)
}

// sameRules: everything but the endpoints' values is the same: the
// endpoint maps' elements are all that differ. A Maglev chain keeps its
// rules while the size of its table stays (and it has endpoints).
func (b chainBody) sameRules(o chainBody) bool {
	return b.family == o.family && b.shortCircuit == o.shortCircuit &&
		b.affinity == o.affinity && b.dropIfEmpty == o.dropIfEmpty && b.maglev == o.maglev && b.topology == o.topology &&
		(len(b.endpoints) == 0) == (len(o.endpoints) == 0) && b.tableSize() == o.tableSize()
}

// affinityObjects names, for each endpoint of a chain with ClientIP
// affinity, the set of clients that stick to it and the chain that sends
// them there. They are the portal's, named after its svc chain and the
// endpoint, and shared by all its chains (svc, ext, all) as kube-proxy
// shares an endpoint's affinity between the ways in: a client sent to an
// endpoint by one way in is sent there by the others, and an endpoint
// that stays keeps its clients across changes (a new timeout included,
// and endpoints added to the only one).
func (b chainBody) affinityObjects(chain string) map[netip.AddrPort][2]string {
	if b.affinity == 0 {
		return nil
	}
	rest := chain
	for _, k := range []string{kindService, kindExternal, kindAll} {
		if strings.HasPrefix(chain, k) {
			rest = chain[len(k):]
			break
		}
	}
	out := make(map[netip.AddrPort][2]string, len(b.endpoints))
	for _, ep := range b.endpoints {
		tail := rest + "@" + ep.String()
		out[ep] = [2]string{affinitySetPrefix + tail, kindAffinityEndpoint + tail}
	}
	return out
}

// affinityObjects are those of all o's chains.
func (o *objects) affinityObjects() map[[2]string]bool {
	var out map[[2]string]bool
	for name, body := range o.chains {
		for _, names := range body.affinityObjects(name) {
			if out == nil {
				out = map[[2]string]bool{}
			}
			out[names] = true
		}
	}
	return out
}

// affinitySetPrefix starts the names of the sets of clients stuck to an
// endpoint.
const affinitySetPrefix = "aff"

// elem is one element of a named set or map; chain is the goto (jump, with
// jump set) target of a verdict map element ("" for plain sets). A flat
// way in's gate element carries its endpoints in eps: its map elements are
// made from them (flat.go).
type elem struct {
	set     string
	key     string // encoded key bytes
	chain   string
	jump    bool
	comment string // "<entry kind> <portal chain>", read back by dump-rules
	eps     []netip.AddrPort
}

func (e elem) id() string { return e.set + "\x00" + e.key }

// ownerID is the id whose owner decides whether the element is the
// portal's: a gate element's is the id of the dispatch element it stands
// for, so that a way in two portals want is one conflict, flat or not.
func (e elem) ownerID() string {
	if e.eps != nil {
		for _, f := range families {
			switch e.set {
			case setFlatGate(f):
				return setVIPs(f) + "\x00" + e.key
			case setFlatGateNP(f):
				return setNodePorts(f) + "\x00" + e.key
			}
		}
	}
	return e.id()
}

// sameValue: the element maps its key to what o maps it to, and names
// the same way in and chain (a gate element's endpoints are compared
// apart: flatUpdate).
func (e elem) sameValue(o elem) bool {
	return e.chain == o.chain && e.jump == o.jump && e.comment == o.comment && (e.eps == nil) == (o.eps == nil)
}

// objects is everything one portal puts into the table.
type objects struct {
	chains map[string]chainBody
	// elems are owned by this portal alone (another portal claiming the
	// same key is a conflict).
	elems []elem
	// shared are plain-set elements several portals may need (a cluster IP
	// with several ports, an endpoint in several Services): reference counted.
	shared []elem
	// rangeSet names the Service's set of source ranges its firewall
	// chain looks the client up in ("" when no way in of the portal is
	// checked), and ranges are what the set holds. Every portal of one
	// Service and family names the same set with the same ranges.
	rangeSet string
	ranges   []netip.Prefix
}

// render computes the kernel objects for one portal. It is pure.
//
// Traffic to a cluster IP goes to the portal's svc chain, which DNATs to an
// endpoint. External traffic under the Cluster policy goes there too (or to
// the all chain when the svc chain only has local endpoints), marked for
// masquerade by the services chain through the ext-marks and np-marks
// sets. Under the Local policy it goes to the ext chain, which sends pods'
// and the node's own traffic to all endpoints and everything else to this
// node's endpoints, unmasqueraded, or drops it. loadBalancerSourceRanges
// add the portal's load-balancer ways in to the fw maps, whose elements
// jump to the Service's one firewall chain: it drops a client outside the
// Service's set of source ranges before the way in is dispatched.
func render(p *portal.Portal, cfg dataplane.Config) *objects {
	o := &objects{chains: map[string]chainBody{}}
	k := p.Key
	f := k.Family
	svcChain := portalChain(kindService, k)
	aff := p.Affinity.TimeoutSeconds
	// With affinity, a client's endpoint is remembered per node and a new
	// client's picked at random: Maglev does not apply.
	mg := p.Balancing == portal.BalancingMaglev && aff == 0

	internal := p.ClusterEndpoints
	if p.InternalLocal {
		internal = p.LocalEndpoints
	}
	if len(internal) > 0 {
		body := chainBody{family: f, endpoints: internal, affinity: aff, maglev: mg}
		if !p.InternalLocal || !p.HasExternal() {
			// Its endpoints are the Cluster policy's, or there are none
			// such: the topology line says why.
			body.topology = p.Topology
		}
		o.chains[svcChain] = body
	}
	for _, ip := range p.ClusterIPs {
		key := vipKey(ip, k.Protocol, p.Port)
		switch {
		case len(internal) > 0:
			o.elems = append(o.elems, elem{set: setVIPs(f), key: string(key), chain: svcChain, comment: entryClusterIP + " " + svcChain})
		case p.InternalLocal && len(p.ClusterEndpoints) > 0:
			// Endpoints exist, none here: drop, as kube-proxy, rather than
			// tell the client the port is closed.
			o.elems = append(o.elems, elem{set: setNoEndpoints(f), key: string(key), chain: chainDrop, comment: entryClusterIP + " " + svcChain})
		default:
			o.elems = append(o.elems, elem{set: setNoEndpoints(f), key: string(key), chain: chainReject, comment: entryClusterIP + " " + svcChain})
		}
		o.shared = append(o.shared, elem{set: setClusterIPs(f), key: string(addrBytes(ip))})
	}

	if p.HasExternal() {
		hasEps := len(p.ClusterEndpoints) > 0
		allChain := svcChain
		if p.InternalLocal && hasEps {
			allChain = portalChain(kindAll, k)
			o.chains[allChain] = chainBody{family: f, endpoints: p.ClusterEndpoints, affinity: aff, maglev: mg, topology: p.Topology}
		}
		target, mark := allChain, true
		if p.ExternalLocal && hasEps {
			target, mark = portalChain(kindExternal, k), false
			o.chains[target] = chainBody{family: f, shortCircuit: allChain, endpoints: p.LocalEndpoints, affinity: aff, dropIfEmpty: true, maglev: mg}
		}
		// The firewall element of a way in follows its dispatch element:
		// both are owned by the portal, or neither (see firewallGuard).
		// Without endpoints too: a client outside the ranges is dropped,
		// as by kube-proxy, not told that the port is closed.
		fw := ""
		if len(p.SourceRanges) > 0 {
			o.rangeSet, o.ranges = rangeSet(f, k.Service), p.SourceRanges
			fw = firewallChain(o.rangeSet)
		}
		addExt := func(entry string, ip netip.Addr, checked bool) {
			key := vipKey(ip, k.Protocol, p.Port)
			o.elems = append(o.elems, targetElem(entry, setVIPs(f), setNoEndpoints(f), key, target, hasEps))
			if checked && fw != "" {
				o.elems = append(o.elems, elem{set: setFirewall(f), key: string(key), chain: fw, jump: true})
			}
			if hasEps && mark {
				o.elems = append(o.elems, elem{set: setExtMarks(f), key: string(key)})
			}
		}
		for _, ip := range p.ExternalIPs {
			addExt(entryExternalIP, ip, false)
		}
		for _, ip := range p.LoadBalancerIPs {
			addExt(entryLoadBalancer, ip, true)
		}
		if p.NodePort != 0 {
			key := protoPortKey(k.Protocol, p.NodePort)
			o.elems = append(o.elems, targetElem(entryNodePort, setNodePorts(f), setNoEndpointsNP(f), key, target, hasEps))
			if cfg.SourceRangesOnNodePorts && fw != "" {
				o.elems = append(o.elems, elem{set: setFirewallNP(f), key: string(key), chain: fw, jump: true})
			}
			if hasEps && mark {
				o.elems = append(o.elems, elem{set: setNodePortMarks(f), key: string(key)})
			}
		}
	}
	// Only this node's endpoints can reach themselves through this node's
	// rules (a pod elsewhere is translated on its own node), so only they
	// are in the hairpin set: at 10k Services x 10 endpoints on many nodes,
	// a hundred elements instead of 100k.
	for _, a := range p.Hairpin {
		o.shared = append(o.shared, elem{set: setHairpin(f), key: string(pairKey(a, a))})
	}
	if !p.InternalLocal {
		// The svc chain of an internalTrafficPolicy: Local portal holds
		// this node's endpoints only; its chain says so (dump-rules, trace).
		flatten(o)
	}
	return o
}

// target is the element that sends key to chain, or to the reject chain
// when there are no endpoints.
func targetElem(entry, set, noepSet string, key []byte, chain string, hasEndpoints bool) elem {
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
