package external

import (
	"context"
	"net/netip"
	"slices"
)

// Provider points provider forwarding (a router, an L2 segment, a cloud
// load balancer) at the nodes that should receive each external IP. The Hook
// calls Update from one goroutine after every change of the cluster state or
// of what this node's dataplane has programmed, within a second; Update must
// not block for long. Close withdraws everything the provider announced
// from this node; it is called once, when the agent stops.
type Provider interface {
	Name() string
	Update(ctx context.Context, s *State) error
	Close(ctx context.Context) error
}

// State is what a Provider is told.
type State struct {
	// Node is this agent's node.
	Node string
	// Leader is true while this agent holds the allocator Lease; cluster-
	// wide providers (webhook) act only then.
	Leader bool
	// Targets are all external IPs with the nodes that should receive them,
	// sorted by IP. An IP shared by several Services appears once per
	// Service.
	Targets []Target
	// NodeAddresses are every node's InternalIP and ExternalIP addresses.
	NodeAddresses map[string][]netip.Addr

	programmed map[netip.Addr]programmed
	alive      func(node string) bool
}

type programmed struct {
	anyEndpoint, localEndpoint bool
	pod                        bool // a pod external IP mapping (ProgrammedPodIPs)
}

// IPs returns the distinct target IPs, sorted.
func (s *State) IPs() []netip.Addr {
	var out []netip.Addr
	for _, t := range s.Targets {
		if len(out) == 0 || out[len(out)-1] != t.IP {
			out = append(out, t.IP)
		}
	}
	return out
}

// Eligible returns the nodes that should receive ip (the union over the
// Services sharing it), sorted.
func (s *State) Eligible(ip netip.Addr) []string {
	var out []string
	for _, t := range s.Targets {
		if t.IP == ip {
			out = append(out, t.Nodes...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Serves reports whether this node should announce ip now: the cluster
// state names it, and its own dataplane has programmed ip (with a local
// endpoint, under the Local policy).
func (s *State) Serves(ip netip.Addr) bool {
	ok := false
	for _, t := range s.Targets {
		if t.IP != ip || !slices.Contains(t.Nodes, s.Node) {
			continue
		}
		p, prog := s.programmed[ip]
		if t.Pod {
			ok = ok || prog && p.pod
			continue
		}
		if !prog || !p.anyEndpoint && !p.localEndpoint || t.Local && !p.localEndpoint {
			continue
		}
		ok = true
	}
	return ok
}

// Alive reports whether node's agent is alive (L2 liveness Leases); true
// for every node when liveness is not tracked.
func (s *State) Alive(node string) bool {
	if s.alive == nil {
		return true
	}
	return s.alive(node)
}
