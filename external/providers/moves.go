package providers

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/portal"
)

// ReasonIPMoved is the event on a Service whose external IP now reaches
// the cluster through other nodes: an L2 takeover, or a change of the
// nodes that announce it over BGP under the Local policy (its next hops).
// Each change is one event, from the part that decides it: under L2 every
// node picks an IP's owner alone from the liveness Leases, and the one
// that takes the IP over says so; the BGP next hops follow from the
// cluster state, and the holder of the allocator Lease says so.
const ReasonIPMoved = "IPMoved"

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

// HopChange is a Local-policy address whose BGP next hops changed: the
// nodes that announced it before, and the Services holding it.
type HopChange struct {
	Was  string
	Svcs []portal.ServiceKey
}

// NextHopChanges compares the BGP next hops of each Local-policy address
// in s with before (nil: nothing known yet, nothing reported) and returns
// them now, with the addresses whose hops changed. The next hops are the
// nodes that should receive the address (Eligible: under the Local
// policy, those with a ready local endpoint), have a BGP peer (peered)
// and that the BGPAdvertisements let announce it. A Service of the
// Cluster policy has
// every eligible node as next hop whatever its endpoints do; it is left
// out.
func NextHopChanges(s *State, before map[netip.Addr]string, peered func(node string) bool) (now map[netip.Addr]string, changed map[netip.Addr]HopChange) {
	now, changed = map[netip.Addr]string{}, map[netip.Addr]HopChange{}
	byIP(s, func(ip netip.Addr, held []Target) {
		if !slices.ContainsFunc(held, func(t Target) bool { return t.Local && !t.Pod }) {
			return
		}
		one := State{Targets: held}
		hops := slices.DeleteFunc(one.Eligible(ip), func(n string) bool { return !peered(n) || !s.view.Ann.BGPAllows(ip, n) })
		now[ip] = strings.Join(hops, ", ")
		if was, ok := before[ip]; ok && was != now[ip] {
			changed[ip] = HopChange{Was: was, Svcs: holders(&one, ip)}
		}
	})
	return now, changed
}
