package difftest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The oracle: what kube-proxy v1.37's semantics demand of every probe of
// the matrix, written from the Service and its endpoints alone. It knows
// the twins' addressing (where the router sends an external address, which
// address a masqueraded packet leaves with) but nothing of either proxy's
// rules, so the same oracle holds any backend to the same outcomes.

// wayKind is a column of the matrix.
type wayKind int

const (
	wayClusterIP wayKind = iota
	wayNodePort
	wayExternalIP
	wayLoadBalancer
)

func (w wayKind) String() string {
	return [...]string{"ClusterIP", "NodePort", "externalIP", "LoadBalancer IP"}[w]
}

// way is one way into a Service: its kind, the node whose address a
// NodePort is reached on, the protocol, and whether the port is one the
// Service does not define.
type way struct {
	Kind      wayKind
	Node      int // NodePort only
	Proto     v1.Protocol
	Undefined bool
}

// spot is a vantage point: the outside client, pod 1 of a node, or a node.
type spot struct {
	Outside bool
	Pod     bool
	Node    int // the node of the pod, or the node itself
}

func (s spot) pod() podRef { return podRef{s.Node, 1} }

// source is the address s sends from.
func (s spot) source(f v1.IPFamily) netip.Addr {
	switch {
	case s.Outside:
		return clientIPOf(f)
	case s.Pod:
		return s.pod().IPOf(f)
	}
	return nodeIPOf(f, s.Node)
}

// inPodNetwork reports whether s sends from inside the proxies'
// --cluster-cidr: only such a source keeps its address to a cluster IP and
// skips externalTrafficPolicy Local.
func (s spot) inPodNetwork(f v1.IPFamily) bool {
	if !s.Pod {
		return false
	}
	for _, c := range strings.Split(clusterCIDRs, ",") {
		if p := netip.MustParsePrefix(c); p.Addr().Is4() == (f == v1.IPv4Protocol) && p.Contains(s.source(f)) {
			return true
		}
	}
	return false
}

// expectation is the outcome the oracle demands: each of Answers (or, with
// OneOf, exactly one of them, every time) and each of Failures, nothing
// else.
type expectation struct {
	Answers  []string
	OneOf    bool
	Failures []string
	// AnyFailure: any of Failures (at least one), and no answer.
	AnyFailure bool
	Why        string
}

func (e expectation) String() string {
	var parts []string
	if e.OneOf {
		parts = append(parts, "one of {"+strings.Join(e.Answers, ", ")+"}")
	} else {
		parts = append(parts, e.Answers...)
	}
	if e.AnyFailure {
		parts = append(parts, "any of {"+strings.Join(e.Failures, ", ")+"}")
	} else {
		parts = append(parts, e.Failures...)
	}
	return "{" + strings.Join(parts, ", ") + "} (" + e.Why + ")"
}

func failWith(label, why string) expectation {
	return expectation{Failures: []string{label}, Why: why}
}

// matches reports whether o is what e demands.
func (e expectation) matches(o outcome) bool {
	answers, failures := split(o)
	if e.AnyFailure {
		return len(answers) == 0 && len(failures) > 0 && !e.unexpected(o)
	}
	for _, a := range answers {
		if !slices.Contains(e.Answers, a) {
			return false
		}
	}
	if e.OneOf {
		if len(answers) != 1 {
			return false
		}
	} else if len(answers) != len(e.Answers) {
		return false
	}
	return slices.Equal(failures, sorted(e.Failures))
}

// unexpected reports whether o holds a label e does not allow.
func (e expectation) unexpected(o outcome) bool {
	answers, failures := split(o)
	for _, a := range answers {
		if !slices.Contains(e.Answers, a) {
			return true
		}
	}
	for _, l := range failures {
		if !slices.Contains(e.Failures, l) {
			return true
		}
	}
	return e.OneOf && len(answers) > 1
}

// tries says how many requests a probe sends at least and at most: enough
// that a pod the oracle leaves out, answering half the time, shows up.
func (e expectation) tries() (least, most int) {
	switch {
	case e.OneOf:
		return 10, 12
	case len(e.Answers) > 0:
		return 8, 30
	}
	return 3, 6
}

func split(o outcome) (answers, failures []string) {
	for _, l := range o {
		if strings.Contains(l, " saw ") {
			answers = append(answers, l)
		} else {
			failures = append(failures, l)
		}
	}
	return answers, failures
}

func sorted(l []string) []string {
	out := slices.Clone(l)
	slices.Sort(out)
	return slices.Compact(out)
}

// served reports whether a proxy handles s at all: the label that gives a
// Service to another proxy leaves it alone. (The headless label counts on
// EndpointSlices only: see behaviour.SliceLabels.)
func served(s *ServiceCase) bool {
	_, other := s.Service.Labels[labelServiceProxyName]
	return !other
}

// Endpoint conditions as the proxies read them: an unset ready or serving
// means true, an unset terminating false.
func (e Endpoint) ready() bool       { return e.Ready == nil || *e.Ready }
func (e Endpoint) serving() bool     { return e.Serving == nil || *e.Serving }
func (e Endpoint) terminating() bool { return e.Terminating != nil && *e.Terminating }
func (e Endpoint) fallback() bool    { return e.serving() && e.terminating() }

// usable reports whether s has an endpoint any node may send to: a ready
// one, or one terminating but still serving.
func (s *ServiceCase) usable() bool {
	return slices.ContainsFunc(s.Endpoints, func(e Endpoint) bool { return e.ready() || e.fallback() })
}

// topology is how node n narrows s's ready endpoints from their hints:
// to the node's own when every ready endpoint has a node hint and one names
// n, else to the zone's when every one has a zone hint and one names n's
// zone, else not at all ("").
func (s *ServiceCase) topology(n int) string {
	allNode, allZone, forNode, forZone, any := true, true, false, false, false
	for _, e := range s.Endpoints {
		if !e.ready() {
			continue
		}
		any = true
		h := s.hints(e)
		if h == nil || len(h.ForNodes) == 0 {
			allNode = false
		} else if slices.ContainsFunc(h.ForNodes, func(x discoveryv1.ForNode) bool { return x.Name == nodeName(n) }) {
			forNode = true
		}
		if h == nil || len(h.ForZones) == 0 {
			allZone = false
		} else if slices.ContainsFunc(h.ForZones, func(x discoveryv1.ForZone) bool { return x.Name == nodeZone(n) }) {
			forZone = true
		}
	}
	switch {
	case !any:
		return ""
	case allNode && forNode:
		return string(v1.ServiceTrafficDistributionPreferSameNode)
	case allZone && forZone:
		return string(v1.ServiceTrafficDistributionPreferSameZone)
	}
	return ""
}

// clusterEndpoints are the endpoints node n sends Cluster-policy traffic
// to: the ready ones its topology leaves, or, when there are none, every
// terminating one still serving.
func (s *ServiceCase) clusterEndpoints(n int) []podRef {
	mode := s.topology(n)
	var out []podRef
	for _, e := range s.Endpoints {
		if !e.ready() {
			continue
		}
		h := s.hints(e)
		switch {
		case mode == string(v1.ServiceTrafficDistributionPreferSameNode) &&
			!slices.ContainsFunc(h.ForNodes, func(x discoveryv1.ForNode) bool { return x.Name == nodeName(n) }):
			continue
		case mode == string(v1.ServiceTrafficDistributionPreferSameZone) &&
			!slices.ContainsFunc(h.ForZones, func(x discoveryv1.ForZone) bool { return x.Name == nodeZone(n) }):
			continue
		}
		out = append(out, e.Pod)
	}
	if len(out) > 0 {
		return out
	}
	for _, e := range s.Endpoints {
		if e.fallback() {
			out = append(out, e.Pod)
		}
	}
	return out
}

// localEndpoints are node n's own endpoints for Local policy: ready, or
// else terminating and serving.
func (s *ServiceCase) localEndpoints(n int) []podRef {
	var rdy, term []podRef
	for _, e := range s.Endpoints {
		switch {
		case e.Pod.Node != n:
		case e.ready():
			rdy = append(rdy, e.Pod)
		case e.fallback():
			term = append(term, e.Pod)
		}
	}
	if len(rdy) > 0 {
		return rdy
	}
	return term
}

// handler is the node that translates a probe from `from` through w: the
// node of the sender for a cluster IP, and for an externalIP or
// load-balancer IP from inside (each node catches those before routing);
// node 1 for those from outside (the router sends the external range
// there); the node whose address a NodePort is on.
func handler(w way, from spot) int {
	switch {
	case w.Kind == wayNodePort:
		return w.Node
	case from.Outside:
		return 1
	}
	return from.Node
}

// expect is the oracle: the outcome of a probe from `from` through w into
// s (nil: no Service has the address) in family f.
func expect(s *ServiceCase, w way, from spot, f v1.IPFamily) expectation {
	e := verdict(s, w, from, f)
	// A node's own datagram that the node itself drops or rejects before
	// it leaves (cluster IPs, externalIPs and load-balancer IPs are
	// translated on output; a NodePort of its own is checked on input)
	// fails its send with EPERM.
	if !from.Outside && !from.Pod && w.Proto == v1.ProtocolUDP && len(e.Answers) == 0 && !e.AnyFailure &&
		w.Kind != wayNodePort && handler(w, from) == from.Node {
		e.Failures, e.Why = []string{"error: operation not permitted"}, e.Why+"; on the sender's own output: EPERM"
	}
	return e
}

func verdict(s *ServiceCase, w way, from spot, f v1.IPFamily) expectation {
	if s == nil {
		return failWith("timeout", "an unallocated address of the Service range is dropped")
	}
	if !served(s) {
		switch w.Kind {
		case wayClusterIP:
			return failWith("timeout", "not served: its cluster IP is an unallocated address of the Service range, dropped")
		case wayNodePort:
			return failWith("refused", "not served: nothing listens on the node's port")
		}
		return expectation{Failures: []string{"timeout", "unreachable"}, AnyFailure: true,
			Why: "not served: the router and node 1 pass the address back and forth until the hop limit"}
	}
	if w.Undefined {
		return failWith("refused", "a port the cluster IP does not define is rejected")
	}
	d := handler(w, from)
	spec := s.Service.Spec
	if w.Kind == wayLoadBalancer && len(spec.LoadBalancerSourceRanges) > 0 && !inRanges(from.source(f), spec.LoadBalancerSourceRanges) {
		return failWith("timeout", "source outside loadBalancerSourceRanges is dropped")
	}
	if !s.usable() {
		return failWith("refused", "no usable endpoints: rejected")
	}
	var eps []podRef
	var masq bool
	var why string
	inside := from.inPodNetwork(f)
	etpLocal := spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	switch {
	case w.Kind == wayClusterIP:
		if spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal {
			if eps = s.localEndpoints(d); len(eps) == 0 {
				return failWith("timeout", "internalTrafficPolicy Local, no endpoint on the node: dropped")
			}
			why = "internalTrafficPolicy Local: the node's endpoints"
		} else {
			eps, why = s.clusterEndpoints(d), "Cluster policy"
		}
		// Sources outside the pod network are masqueraded.
		masq = !inside
		if masq {
			why += ", masqueraded (source outside the cluster CIDR)"
		}
	case etpLocal && !inside && (from.Outside || from.Pod || from.Node != d):
		if eps = s.localEndpoints(d); len(eps) == 0 {
			return failWith("timeout", "externalTrafficPolicy Local, no endpoint on the node: dropped")
		}
		why = "externalTrafficPolicy Local: the node's endpoints, the source kept"
	case etpLocal:
		// The pod network and the node itself reach every endpoint
		// (kube-proxy's short-circuit); only the node is masqueraded.
		eps, masq, why = s.clusterEndpoints(d), !inside, "externalTrafficPolicy Local from inside: every endpoint"
	default:
		eps, masq, why = s.clusterEndpoints(d), true, "externalTrafficPolicy Cluster: masqueraded"
	}
	target := matrixTCPTarget
	if w.Proto == v1.ProtocolUDP {
		target = matrixUDPTarget
	}
	e := expectation{Why: why, OneOf: spec.SessionAffinity == v1.ServiceAffinityClientIP}
	for _, p := range eps {
		src := from.source(f)
		// A pod sent to itself through the node it lives on: masqueraded
		// there, or it would answer itself.
		hairpin := from.Pod && p == from.pod() && p.Node == d
		switch {
		case masq || hairpin:
			// The handler masquerades to its address toward the pod.
			src = nodeIPOf(f, d)
			if p.Node == d {
				src = bridgeIPOf(f, d)
			}
		case d != p.Node && !(from.Pod && from.Node == d):
			// The reply bypasses the node that translated the request
			// (a pod's request to another node's NodePort, kept
			// unmasqueraded, answered by a pod beside the sender, or by
			// the sender itself).
			e.Failures = append(e.Failures, "timeout")
			continue
		}
		e.Answers = append(e.Answers, fmt.Sprintf("%s:%d saw %s", p.Name(), target, src))
	}
	e.Answers, e.Failures = sorted(e.Answers), sorted(e.Failures)
	return e
}

func inRanges(a netip.Addr, ranges []string) bool {
	for _, r := range ranges {
		if p, err := netip.ParsePrefix(r); err == nil && p.Contains(a) {
			return true
		}
	}
	return false
}
