package portal

import (
	"fmt"
	"net/netip"
	"slices"
)

// Protocol is an L4 protocol, numbered as in IP headers (IANA), so that
// backends can use it directly as meta l4proto.
type Protocol uint8

// The protocols a Service port can use.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// ParseProtocol maps a Kubernetes protocol name to a Protocol.
func ParseProtocol(s string) (Protocol, bool) {
	switch s {
	case "TCP", "tcp":
		return TCP, true
	case "UDP", "udp":
		return UDP, true
	case "SCTP", "sctp":
		return SCTP, true
	}
	return 0, false
}

// Family is an IP family.
type Family uint8

// The IP families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() || a.Is4In6() {
		return IPv4
	}
	return IPv6
}

// ServiceKey names a Service.
type ServiceKey struct {
	Namespace, Name string
}

func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// PortKey names one port of one Service in one IP family: the unit the
// dataplane programs.
type PortKey struct {
	Service  ServiceKey
	Port     string // the Service port's name; "" when unnamed
	Protocol Protocol
	Family   Family
}

func (k PortKey) String() string {
	return fmt.Sprintf("%s:%s/%s/%s", k.Service, k.Port, k.Protocol, k.Family)
}

// Affinity is ClientIP session affinity; the zero value means none.
type Affinity struct {
	TimeoutSeconds uint32
}

// Portal is the desired state of one Service port in one IP family: every
// way into it and the endpoints traffic is DNATed to. All addresses are of
// Key.Family. Slices are sorted, so that two Portals built from the same
// objects are Equal.
type Portal struct {
	Key  PortKey
	Port uint16 // the Service port

	ClusterIPs      []netip.Addr
	NodePort        uint16 // 0 when none
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// SourceRanges restrict who may reach LoadBalancerIPs; empty allows all.
	// When one holds the node's address (Config.NodeIPs), the
	// LoadBalancerIPs are in it too, as single addresses: the node's own
	// connection to a VIP that is local to it loops back from the VIP.
	SourceRanges []netip.Prefix

	// ExternalLocal is externalTrafficPolicy: Local: external traffic
	// (NodePort, external and load-balancer IPs) only reaches LocalEndpoints
	// and keeps its source address.
	ExternalLocal bool
	// InternalLocal is internalTrafficPolicy: Local: cluster-IP traffic only
	// reaches LocalEndpoints.
	InternalLocal bool
	// HealthCheckNodePort is the Service's healthCheckNodePort: set for
	// every LoadBalancer Service with externalTrafficPolicy: Local, also
	// when the family has no way in (ExternalLocal false), as kube-proxy
	// serves it; LocalReady is counted whenever it is set.
	HealthCheckNodePort uint16
	Affinity            Affinity
	// Scheduler is the IPVS scheduler asked for with the onehop.io/scheduler
	// annotation ("" for the agent's default); the nft backend ignores it.
	Scheduler string
	// Balancing is how the nft backend picks an endpoint: at random, or
	// by Maglev consistent hashing (the onehop.io/balancing annotation, or
	// the cluster-wide default).
	Balancing Balancing

	// ClusterEndpoints serve traffic under the Cluster policy: ready
	// endpoints, or serving terminating ones when none is ready, after
	// topology filtering.
	ClusterEndpoints []netip.AddrPort
	// LocalEndpoints are the endpoints on this node, chosen the same way
	// among local ones; used by Local policies.
	LocalEndpoints []netip.AddrPort
	// Serving are all the endpoints that serve this port, sorted: ready,
	// or serving and terminating, whatever topology, traffic policies and
	// the choice between ready and terminating ones make of them; they
	// include ClusterEndpoints and LocalEndpoints. A flow DNATed to one of
	// them may stay on it across a change of the Service, as in
	// kube-proxy. No backend programs them. When they are the same as
	// ClusterEndpoints (every endpoint ready, no topology) the two share
	// one array.
	Serving []netip.AddrPort
	// Topology says how topology hints narrowed ClusterEndpoints, for
	// dump-rules: "node hints for <node>", "zone hints for <zone>", or
	// "none: <why>"; "" when the Service neither asks for a traffic
	// distribution nor has hints.
	Topology string
	// Hairpin are the addresses of the endpoints on this node among
	// ClusterEndpoints and LocalEndpoints, sorted: the pods that may reach
	// themselves through the Service, whose traffic must then be
	// masqueraded. A pod on another node is translated there, never here.
	Hairpin []netip.Addr
	// LocalReady counts the ready endpoints on this node (distinct
	// addresses): what health-check node ports report. Terminating
	// endpoints, which LocalEndpoints may fall back to, do not count, so
	// that load balancers drain the node.
	LocalReady int
}

// Equal reports whether p and q program the same dataplane state: every
// field but Serving, which no backend programs (Same compares it too).
func (p *Portal) Equal(q *Portal) bool {
	if p == q {
		return true
	}
	if p == nil || q == nil {
		return false
	}
	return p.Key == q.Key && p.Port == q.Port && p.NodePort == q.NodePort &&
		p.ExternalLocal == q.ExternalLocal && p.InternalLocal == q.InternalLocal &&
		p.HealthCheckNodePort == q.HealthCheckNodePort && p.Affinity == q.Affinity && p.LocalReady == q.LocalReady && p.Scheduler == q.Scheduler && p.Balancing == q.Balancing && p.Topology == q.Topology &&
		slices.Equal(p.ClusterIPs, q.ClusterIPs) &&
		slices.Equal(p.ExternalIPs, q.ExternalIPs) &&
		slices.Equal(p.LoadBalancerIPs, q.LoadBalancerIPs) &&
		slices.Equal(p.SourceRanges, q.SourceRanges) &&
		slices.Equal(p.ClusterEndpoints, q.ClusterEndpoints) &&
		slices.Equal(p.LocalEndpoints, q.LocalEndpoints) &&
		slices.Equal(p.Hairpin, q.Hairpin)
}

// Same reports whether p and q are Equal and have the same Serving
// endpoints: whether any reader of a Portal, the conntrack cleanup
// included, can tell them apart.
func (p *Portal) Same(q *Portal) bool {
	return p.Equal(q) && (p == q || slices.Equal(p.Serving, q.Serving))
}

// HasExternal reports whether the portal can be reached from outside the
// cluster (NodePort, external or load-balancer IPs).
func (p *Portal) HasExternal() bool {
	return p.NodePort != 0 || len(p.ExternalIPs) > 0 || len(p.LoadBalancerIPs) > 0
}

// Service is the desired state of one Service: its portals, sorted by key.
type Service struct {
	Key     ServiceKey
	Portals []*Portal
}

// Equal reports whether s and t program the same dataplane state.
func (s *Service) Equal(t *Service) bool {
	if s == nil || t == nil {
		return s == t
	}
	return s.Key == t.Key && slices.EqualFunc(s.Portals, t.Portals, (*Portal).Equal)
}

// Same reports whether s and t are Equal and their portals the Same.
func (s *Service) Same(t *Service) bool {
	if s == nil || t == nil {
		return s == t
	}
	return s.Key == t.Key && slices.EqualFunc(s.Portals, t.Portals, (*Portal).Same)
}

// Node is the node-level state the dataplane needs.
type Node struct {
	Name string
	// NodePortAddrs are the local addresses NodePorts are served on.
	NodePortAddrs []netip.Addr
	// PodExternalIPs are the external IPs of pods on this node, sorted by
	// External: 1:1 NAT in both directions, no balancing.
	PodExternalIPs []PodExternalIP
}

// PodExternalIP maps an external IP to one pod.
type PodExternalIP struct {
	External netip.Addr
	Pod      netip.Addr
	Name     ServiceKey // the Pod's namespace and name
}

// Snapshot is the desired state handed to a dataplane. Services is owned by
// the producer; a dataplane reads it during Sync and must not keep or change
// it (it may keep the *Service and *Portal values, which are immutable).
type Snapshot struct {
	Node     Node
	Services map[ServiceKey]*Service
	// Dirty lists the Services that changed since the previous snapshot
	// (added, changed or deleted). A dataplane that applied the previous
	// snapshot only needs to look at these.
	Dirty []ServiceKey
	// ServiceCIDRs are the ranges cluster IPs come from (every
	// ServiceCIDR object's and the configured ones, see UnionCIDRs):
	// sorted, masked, none inside another. Nil when none is known.
	ServiceCIDRs []netip.Prefix
}
