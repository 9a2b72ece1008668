package difftest

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The oracle gives, for a few cells written out by hand from kube-proxy's
// rules, the outcome those rules demand; and its expectations reject the
// outcomes they should.
func TestMatrixOracle(t *testing.T) {
	f := v1.IPv4Protocol
	c := matrixCase(f)
	svc := func(key string) *ServiceCase { return c.service(matrixServiceName(key, f)) }
	outside, pod1, node2 := spot{Outside: true}, spot{Pod: true, Node: 1}, spot{Node: 2}
	tcp := func(k wayKind, node int) way { return way{Kind: k, Node: node, Proto: v1.ProtocolTCP} }
	udp := func(k wayKind, node int) way { return way{Kind: k, Node: node, Proto: v1.ProtocolUDP} }
	for _, tc := range []struct {
		name string
		s    *ServiceCase
		w    way
		from spot
		want string
		one  bool
	}{
		{"a pod reaching itself is masqueraded, the other pod sees the pod", svc("balance"), tcp(wayClusterIP, 0), pod1,
			"pod-1-1:8080 saw 10.244.1.1, pod-2-2:8080 saw 10.244.1.11", false},
		{"Cluster policy from outside: masqueraded by the node the router picks", svc("masquerade"), tcp(wayLoadBalancer, 0), outside,
			"pod-2-2:8080 saw 192.0.2.11", false},
		{"Cluster policy NodePort: masqueraded toward a pod of the node", svc("balance"), udp(wayNodePort, 2), outside,
			"pod-1-1:5353 saw 192.0.2.12, pod-2-2:5353 saw 10.244.2.1", false},
		{"externalTrafficPolicy Local: the node's pods, the client kept", svc("etp-local"), tcp(wayNodePort, 1), outside,
			"pod-1-1:8080 saw 198.51.100.10, pod-1-2:8080 saw 198.51.100.10", false},
		{"externalTrafficPolicy Local: a node without endpoints drops", svc("etp-local"), tcp(wayNodePort, 2), outside, "timeout", false},
		{"externalTrafficPolicy Local: the node itself reaches every endpoint, masqueraded", svc("etp-local"), tcp(wayExternalIP, 0), node2,
			"pod-1-1:8080 saw 192.0.2.12, pod-1-2:8080 saw 192.0.2.12", false},
		{"externalTrafficPolicy Local: another node's NodePort keeps a node's address", svc("etp-local"), tcp(wayNodePort, 1), node2,
			"pod-1-1:8080 saw 192.0.2.12, pod-1-2:8080 saw 192.0.2.12", false},
		{"externalTrafficPolicy Local: a pod's request to another node's NodePort comes back past it", svc("etp-local"), tcp(wayNodePort, 2), pod1,
			"timeout", false},
		{"internalTrafficPolicy Local: a node without endpoints drops", svc("itp-local"), tcp(wayClusterIP, 0), spot{Pod: true, Node: 2}, "timeout", false},
		{"no endpoints: rejected", svc("no-endpoints"), udp(wayNodePort, 1), pod1, "refused", false},
		{"no endpoints: a node's own datagram fails on output", svc("no-endpoints"), udp(wayClusterIP, 0), node2, "error: operation not permitted", false},
		{"source ranges: the client outside them is dropped", svc("ranges-denied"), tcp(wayLoadBalancer, 0), outside, "timeout", false},
		{"source ranges: NodePorts are not subject to them", svc("ranges-denied"), tcp(wayNodePort, 1), outside,
			"pod-1-2:8080 saw 10.244.1.1, pod-2-2:8080 saw 192.0.2.11", false},
		{"only terminating endpoints: the serving one", svc("terminating"), tcp(wayClusterIP, 0), pod1, "pod-1-2:8080 saw 10.244.1.11", false},
		{"not ready: left out", svc("not-ready"), tcp(wayClusterIP, 0), node2, "pod-1-2:8080 saw 192.0.2.12", false},
		{"PreferSameZone: the zone's pod", svc("same-zone"), tcp(wayClusterIP, 0), node2, "pod-2-2:8080 saw 10.244.2.1", false},
		{"PreferSameNode: from outside too, the handling node's pod", svc("same-node"), tcp(wayNodePort, 1), outside, "pod-1-2:8080 saw 10.244.1.1", false},
		{"ClientIP affinity: one pod", svc("affinity"), tcp(wayClusterIP, 0), pod1, "pod-1-2:8080 saw 10.244.1.11, pod-2-2:8080 saw 10.244.1.11", true},
		{"service-proxy-name: a NodePort nobody serves", svc("other-proxy"), tcp(wayNodePort, 1), outside, "refused", false},
		{"service-proxy-name: its cluster IP is dropped", svc("other-proxy"), tcp(wayClusterIP, 0), pod1, "timeout", false},
		{"headless label on the slices: no endpoints", behaviour{SliceLabels: map[string]string{labelHeadless: ""}}.seen(svc("headless-slices")),
			tcp(wayLoadBalancer, 0), outside, "refused", false},
		{"no Service: dropped", nil, udp(wayClusterIP, 0), pod1, "timeout", false},
	} {
		e := expect(tc.s, tc.w, tc.from, f)
		got := strings.Join(append(append([]string(nil), e.Answers...), e.Failures...), ", ")
		if got != tc.want || e.OneOf != tc.one {
			t.Errorf("%s: oracle says %s, want {%s} (one of: %v)", tc.name, e, tc.want, tc.one)
		}
	}

	two := expectation{Answers: []string{"a saw x", "b saw x"}}
	one := expectation{Answers: two.Answers, OneOf: true}
	loop := expectation{Failures: []string{"timeout", "unreachable"}, AnyFailure: true}
	for _, tc := range []struct {
		e    expectation
		o    outcome
		want bool
	}{
		{two, outcome{"a saw x", "b saw x"}, true},
		{two, outcome{"a saw x"}, false},
		{two, outcome{"a saw x", "b saw x", "timeout"}, false},
		{two, outcome{"a saw x", "c saw x", "b saw x"}, false},
		{one, outcome{"b saw x"}, true},
		{one, outcome{"a saw x", "b saw x"}, false},
		{loop, outcome{"timeout"}, true},
		{loop, outcome{"timeout", "unreachable"}, true},
		{loop, outcome{"refused"}, false},
		{loop, outcome{"a saw x", "timeout"}, false},
		{expectation{Failures: []string{"refused"}}, outcome{"refused", "timeout"}, false},
	} {
		if got := tc.e.matches(tc.o); got != tc.want {
			t.Errorf("%s matches %s: %v, want %v", tc.e, tc.o, got, tc.want)
		}
	}
}

// Every row is probed through each way it names, over TCP and UDP, in both
// families, from every vantage point the way can be reached from.
func TestMatrixCells(t *testing.T) {
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		c := matrixCase(f)
		cells := matrixCells(c, behaviours(), f)
		count := map[string]int{}
		for _, cell := range cells {
			count[cell.Row.Key+"/"+cell.Way.Kind.String()+"/"+string(cell.Way.Proto)]++
			if cell.Family != f || !strings.Contains(cell.Probe.To.Addr, map[v1.IPFamily]string{v1.IPv4Protocol: ".", v1.IPv6Protocol: "]:"}[f]) {
				t.Errorf("%s cell %s is not of its family", f, cell.Probe)
			}
		}
		for _, b := range behaviours() {
			for _, k := range []wayKind{wayClusterIP, wayNodePort, wayExternalIP, wayLoadBalancer} {
				want := map[wayKind]int{wayClusterIP: 2 * nodes, wayNodePort: nodes * (1 + 2*nodes), wayExternalIP: 1 + 2*nodes, wayLoadBalancer: 1 + 2*nodes}[k]
				if b.Ways != nil && !slices.Contains(b.Ways, k) {
					want = 0
				}
				for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
					if got := count[b.Key+"/"+k.String()+"/"+string(p)]; got != want {
						t.Errorf("%s %s %s %s: %d probes, want %d", f, b.Name, k, p, got, want)
					}
				}
			}
		}
	}
}
