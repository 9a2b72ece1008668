package external

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/portal"
)

// reasonIPMoved is the event on a Service whose external IP now reaches
// the cluster through other nodes: an L2 takeover, or a change of the
// nodes that announce it over BGP under the Local policy (its next hops).
// Each change is one event, from the part that decides it: under L2 every
// node picks an IP's owner alone from the liveness Leases, and the one
// that takes the IP over says so; the BGP next hops follow from the
// cluster state, and the holder of the allocator Lease says so.
const reasonIPMoved = "IPMoved"

// holders are the Services holding ip in s (pods have no events of this
// kind).
func holders(s *State, ip netip.Addr) []portal.ServiceKey {
	var out []portal.ServiceKey
	for _, t := range s.held(ip) {
		if !t.Pod && !slices.Contains(out, t.Service) {
			out = append(out, t.Service)
		}
	}
	return out
}

// tookOver returns the IPs this node (s.Node) answers for now that it did
// not before (had) and that another node owned at the previous look
// (before: an IP's owner then; nil at the first look, which reports
// nothing: a node that starts has not seen the others answer), with that
// node.
func tookOver(s *State, before func(netip.Addr) string, had map[netip.Addr]bool, own []netip.Addr) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	if before == nil {
		return out
	}
	for _, ip := range own {
		if prev := before(ip); prev != "" && prev != s.Node && !had[ip] {
			out[ip] = prev
		}
	}
	return out
}

// l2TookOver puts an IPMoved event on each Service holding ip (svcs),
// which this node answers for now in place of node from.
func (h *Hook) l2TookOver(ip netip.Addr, from string, svcs []portal.ServiceKey) {
	h.log.Info("l2: took over an IP", "ip", ip, "from", from)
	h.moved(h.rec, svcs, corev1.EventTypeNormal, "%s moved to node %s (l2: it answers ARP/NDP for it now), from node %s", ip, h.node, from)
}

// moved puts an IPMoved event on each of svcs, recorded by rec (the
// node's, or the leader's).
func (h *Hook) moved(rec record.EventRecorder, svcs []portal.ServiceKey, typ, msg string, args ...any) {
	for _, k := range svcs {
		obj, ok, _ := h.services.GetStore().GetByKey(k.Namespace + "/" + k.Name)
		if !ok {
			continue
		}
		rec.Eventf(obj.(*corev1.Service), typ, reasonIPMoved, msg, args...)
	}
}

// ipMoves is what the leader last saw of the BGP next hops.
type ipMoves struct {
	// hops are the nodes that announce each Local-policy address over
	// BGP, joined; nil until the first look of a leadership term, which
	// only records them.
	hops map[netip.Addr]string
	// crdPeers are the accepted BGPPeers (the controller's configuration
	// has no peers of its own from them): a node none of them picks does
	// not announce, unless the file's bgp section gives it peers.
	crdPeers []peerRule
}

// peered reports whether node has a BGP peer: every node has the file's,
// and a BGPPeer's nodeSelector picks some.
func (h *Hook) peered(node string) bool {
	if h.conf().BGP != nil {
		return true
	}
	nl := h.nodeLabels(node)
	return slices.ContainsFunc(h.moves.crdPeers, func(p peerRule) bool { return p.nodes == nil || p.nodes.Matches(nl) })
}

// byIP calls fn for each IP of s with the targets that hold it (s.Targets
// is sorted by IP): one pass, however many IPs.
func byIP(s *State, fn func(ip netip.Addr, held []Target)) {
	for i := 0; i < len(s.Targets); {
		j := i + 1
		for j < len(s.Targets) && s.Targets[j].IP == s.Targets[i].IP {
			j++
		}
		fn(s.Targets[i].IP, s.Targets[i:j])
		i = j
	}
}

// hopChange is a Local-policy address whose BGP next hops changed: the
// nodes that announced it before, and the Services holding it.
type hopChange struct {
	was  string
	svcs []portal.ServiceKey
}

// nextHopChanges compares the BGP next hops of each Local-policy address
// in s with before (nil: nothing known yet, nothing reported) and returns
// them now, with the addresses whose hops changed. The next hops are the
// nodes that should receive the address (Eligible: under the Local
// policy, those with a ready local endpoint), have a BGP peer (peered)
// and that the BGPAdvertisements let announce it. A Service of the
// Cluster policy has
// every eligible node as next hop whatever its endpoints do; it is left
// out.
func nextHopChanges(s *State, before map[netip.Addr]string, peered func(node string) bool) (now map[netip.Addr]string, changed map[netip.Addr]hopChange) {
	now, changed = map[netip.Addr]string{}, map[netip.Addr]hopChange{}
	byIP(s, func(ip netip.Addr, held []Target) {
		if !slices.ContainsFunc(held, func(t Target) bool { return t.Local && !t.Pod }) {
			return
		}
		one := State{Targets: held}
		hops := slices.DeleteFunc(one.Eligible(ip), func(n string) bool { return !peered(n) || !s.ann.bgpAllows(ip, n) })
		now[ip] = strings.Join(hops, ", ")
		if was, ok := before[ip]; ok && was != now[ip] {
			changed[ip] = hopChange{was: was, svcs: holders(&one, ip)}
		}
	})
	return now, changed
}

// noteNextHops puts an IPMoved event on the Services of each Local-policy
// address whose BGP next hops changed since the last look; only the leader
// (leader) looks, and a new term starts afresh.
func (h *Hook) noteNextHops(s *State, leader bool) {
	if !leader || h.conf().BGP == nil && len(h.moves.crdPeers) == 0 {
		h.moves.hops = nil
		return
	}
	now, changed := nextHopChanges(s, h.moves.hops, h.peered)
	if h.moves.hops == nil {
		changed = nil
	}
	h.moves.hops = now
	for ip, c := range changed {
		if now[ip] == "" {
			h.moved(h.leaderRec, c.svcs, corev1.EventTypeWarning, "%s: no node announces it over BGP now (none has a ready local endpoint it may announce it for), it was %s", ip, c.was)
			continue
		}
		h.moved(h.leaderRec, c.svcs, corev1.EventTypeNormal, "%s: BGP next hops now %s, were %s", ip, now[ip], nodeList(c.was))
	}
}

// nodeList spells joined nodes for an event, "none" for none.
func nodeList(nodes string) string {
	if nodes == "" {
		return "none"
	}
	return nodes
}
