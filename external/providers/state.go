package providers

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// Provider points provider forwarding (a router, an L2 segment, a cloud
// load balancer) at the nodes that should receive each external IP. The hook
// calls Update from one goroutine after every change of the cluster state or
// of what this node's dataplane has programmed, within a second; Update must
// not block for long. Close withdraws everything the provider announced
// from this node; it is called once, when the agent stops (CloseForRestart
// instead for a Restartable provider) or its configuration changes.
type Provider interface {
	Name() string
	Update(ctx context.Context, s *State) error
	Close(ctx context.Context) error
}

// Restartable is a Provider that can stop for a restart of the agent
// without withdrawing what it announced, its routers keeping it until the
// agent is back while the dataplane, which stays, serves it. The hook
// calls CloseForRestart instead of Close when the agent stops.
type Restartable interface {
	CloseForRestart(ctx context.Context) error
}

// State is what a Provider is told.
type State struct {
	// Node is this agent's node.
	Node string
	// Leader is true while this agent holds the allocator Lease; cluster-
	// wide providers (webhook) act only then.
	Leader bool
	// Targets are all external IPs with the nodes that should receive them,
	// sorted by IP, for their rightful holders only. An IP shared by
	// several Services appears once per Service.
	Targets []Target
	// NodeAddresses are every node's InternalIP and ExternalIP addresses.
	NodeAddresses map[string][]netip.Addr

	// view is what else the hook saw (NewState).
	view View
	// at indexes Targets by IP (indexTargets); nil in a State made by
	// hand, which is then searched.
	at map[netip.Addr]span
}

// View is what the hook saw beside the targets, for a State.
type View struct {
	// Cluster are the nodes eligible under the Cluster policy, sorted:
	// the Nodes of every Cluster-policy target share it.
	Cluster []string
	// Programmed is what this node's dataplane serves, per address and
	// Service; PodIPs the pod external IPs it maps.
	Programmed map[Served]Programmed
	PodIPs     map[netip.Addr]bool
	// Reported: the dataplane has told both at least once, so that they
	// are all it serves, not the nothing of an agent just started.
	Reported bool
	// Alive says whether a node's agent is alive (nil: every node is).
	Alive func(node string) bool
	// Ann applies the advertisements (nil: everything is announced).
	Ann *config.Announcer
}

// NewState is s with what the hook saw (v), its Targets (sorted by IP, as
// Targets makes them) indexed by IP.
func NewState(s State, v View) *State {
	s.view = v
	s.indexTargets()
	return &s
}

// span is a run of Targets, [from, to).
type span struct{ from, to int }

// indexTargets indexes s.Targets (sorted by IP) by IP.
func (s *State) indexTargets() {
	s.at = map[netip.Addr]span{}
	from := 0
	byIP(s, func(ip netip.Addr, held []Target) {
		s.at[ip] = span{from, from + len(held)}
		from += len(held)
	})
}

// held are the targets of ip: one per Service holding it, or its Pod.
func (s *State) held(ip netip.Addr) []Target {
	if s.at != nil {
		r := s.at[ip]
		return s.Targets[r.from:r.to]
	}
	var out []Target
	for _, t := range s.Targets {
		if t.IP == ip {
			out = append(out, t)
		}
	}
	return out
}

// Served names one Service's use of one address.
type Served struct {
	IP      netip.Addr
	Service portal.ServiceKey
}

// Programmed is what the dataplane holds of one Served: whether with any
// endpoint, and with a local one.
type Programmed struct{ AnyEndpoint, LocalEndpoint bool }

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

// Eligible returns the nodes that should receive ip: those that serve every
// Service holding it (the intersection: a node serving only some of them
// would black-hole the others' clients), sorted.
func (s *State) Eligible(ip netip.Addr) []string {
	var out []string
	for i, t := range s.held(ip) {
		if i == 0 {
			out = slices.Clone(t.Nodes)
			continue
		}
		out = slices.DeleteFunc(out, func(n string) bool { return !hasNode(t.Nodes, n) })
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// hasNode reports whether the sorted nodes hold node.
func hasNode(nodes []string, node string) bool {
	_, ok := slices.BinarySearch(nodes, node)
	return ok
}

// Serves reports whether this node should announce ip now: for every holder
// of ip (each Service sharing it, or its Pod) the cluster state names this
// node, and its own dataplane has programmed ip for that holder (with a local
// endpoint, under the Local policy).
func (s *State) Serves(ip netip.Addr) bool {
	found := false
	for _, t := range s.held(ip) {
		found = true
		if !hasNode(t.Nodes, s.Node) {
			return false
		}
		if t.Pod {
			if !s.view.PodIPs[ip] {
				return false
			}
			continue
		}
		p, prog := s.view.Programmed[Served{ip, t.Service}]
		if !prog || !p.AnyEndpoint && !p.LocalEndpoint || t.Local && !p.LocalEndpoint {
			return false
		}
	}
	return found
}

// DataplaneReported reports whether this node's dataplane has told what
// it serves at least once: Serves is then all the node serves, not the
// nothing of an agent just started.
func (s *State) DataplaneReported() bool { return s.view.Reported }

// Alive reports whether node's agent is alive (L2 liveness Leases); true
// for every node when liveness is not tracked.
func (s *State) Alive(node string) bool {
	if s.view.Alive == nil {
		return true
	}
	return s.view.Alive(node)
}

// Fingerprint: providers are called again only when something they can see
// changed (including liveness and what this node serves). It grows with
// the targets and with the nodes, not with their product: the nodes of the
// Cluster policy are written once, each node's liveness once, and the L2
// advertisements as which of them pick each address and each node.
func Fingerprint(s *State) string {
	b := fmt.Appendf(nil, "%v|%v|%v|", s.Leader, s.view.Reported, s.view.Cluster)
	for _, t := range s.Targets {
		var nodes any = t.Nodes
		if len(t.Nodes) > 0 && sameNodes(t.Nodes, s.view.Cluster) {
			nodes = "cluster"
		}
		b = fmt.Appendf(b, "%s %s %v %v %d %v;", t.IP, t.Service, t.Local, nodes, t.HealthCheckNodePort, t.Ports)
	}
	for _, ip := range s.IPs() {
		b = fmt.Appendf(b, "%s:%v:%v:%s;", ip, s.Serves(ip), s.view.Ann.BGPRoutes(ip, s.Node), s.view.Ann.L2PicksIP(ip))
	}
	for _, n := range slices.Sorted(maps.Keys(s.NodeAddresses)) {
		b = fmt.Appendf(b, "%s=%v%s,", n, s.Alive(n), s.view.Ann.L2PicksNode(n))
	}
	b = fmt.Appendf(b, "%v", s.NodeAddresses)
	return string(b)
}
