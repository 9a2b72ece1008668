package portal

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

func hostPorts(ips ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(netip.MustParseAddr(ip), 8080))
	}
	return out
}

// Topology as kube-proxy v1.37 applies it (its TestCategorizeEndpoints,
// with the Service API as input): node hints first, then zone hints, each
// all or nothing over the ready endpoints, on the Cluster policy's
// endpoints only. This node is n1 in zone z1.
func TestTopology(t *testing.T) {
	// The EndpointSlice controller's hints for PreferSameNode: each ready
	// endpoint hinted for its own node and its own zone.
	yes, no := ptr.To(true), ptr.To(false)
	a := ep{ip: "10.244.1.2", node: "n1", nodes: []string{"n1"}, zones: []string{"z1"}}
	b := ep{ip: "10.244.2.2", node: "n2", nodes: []string{"n2"}, zones: []string{"z2"}}
	c := ep{ip: "10.244.3.2", node: "n3", nodes: []string{"n3"}, zones: []string{"z1"}}
	d := ep{ip: "10.244.4.2", node: "n4", nodes: []string{"n4"}, zones: []string{"z3"}}
	zoneOnly := func(e ep) ep { e.nodes = nil; return e }
	noHints := func(e ep) ep { e.nodes, e.zones = nil, nil; return e }
	unready := func(e ep) ep { e.ready, e.serving = no, no; return e }
	terminating := func(e ep) ep { e.ready, e.serving, e.terminating = no, yes, yes; return e }
	local := func(e ep) ep { e.node = "n1"; return e }
	dist := func(v string) func(*v1.Service) {
		return func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To(v) }
	}
	nodePort := func(etp v1.ServiceExternalTrafficPolicy) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameNode)
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = etp
		}
	}
	itpLocal := func(s *v1.Service) {
		s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameZone)
		s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	cases := []struct {
		name    string
		mut     func(*v1.Service)
		zone    string // this node's zone; "-" for none
		eps     []ep
		cluster []netip.AddrPort
		local   []netip.AddrPort // nil: not checked
		why     string           // Portal.Topology; a prefix when it ends in "*"
	}{
		{
			name: "PreferSameNode: the endpoint hinted for this node only",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{a, b, c, d},
			cluster: hostPorts("10.244.1.2"), why: "node hints for n1",
		},
		{
			name: "node hints not for this node: zone hints",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{b, c, d},
			cluster: hostPorts("10.244.3.2"), why: "zone hints for z1",
		},
		{
			name: "node hints on some endpoints only: zone hints",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{a, zoneOnly(b), c},
			cluster: hostPorts("10.244.1.2", "10.244.3.2"), why: "zone hints for z1",
		},
		{
			name: "an endpoint without any hint: none, all ready endpoints",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{a, noHints(b), c, d},
			cluster: hostPorts("10.244.1.2", "10.244.2.2", "10.244.3.2", "10.244.4.2"),
			why:     "none: not every ready endpoint has a node hint; not every ready endpoint has a zone hint",
		},
		{
			name: "neither this node nor its zone hinted: none",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{b, d},
			cluster: hostPorts("10.244.2.2", "10.244.4.2"),
			why:     "none: no endpoint hinted for node n1; no endpoint hinted for zone z1",
		},
		{
			name: "PreferSameZone: the endpoints hinted for this node's zone",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameZone), eps: []ep{zoneOnly(a), zoneOnly(b), zoneOnly(c), zoneOnly(d)},
			cluster: hostPorts("10.244.1.2", "10.244.3.2"), why: "zone hints for z1",
		},
		{
			name: "PreferClose is PreferSameZone",
			mut:  dist(v1.ServiceTrafficDistributionPreferClose), eps: []ep{zoneOnly(a), zoneOnly(b), zoneOnly(c)},
			cluster: hostPorts("10.244.1.2", "10.244.3.2"), why: "zone hints for z1",
		},
		{
			name: "the topology-mode annotation: zone hints",
			mut:  func(s *v1.Service) { s.Annotations = map[string]string{v1.AnnotationTopologyMode: "Auto"} },
			eps:  []ep{zoneOnly(a), zoneOnly(b)}, cluster: hostPorts("10.244.1.2"), why: "zone hints for z1",
		},
		{
			name: "several zones per endpoint: each endpoint that names this zone",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameZone),
			eps: []ep{
				{ip: "10.244.1.2", node: "n2", zones: []string{"z2", "z1"}},
				{ip: "10.244.2.2", node: "n2", zones: []string{"z2"}},
			},
			cluster: hostPorts("10.244.1.2"), why: "zone hints for z1",
		},
		{
			name: "this node has no zone label: none",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameZone), zone: "-", eps: []ep{zoneOnly(a), zoneOnly(b)},
			cluster: hostPorts("10.244.1.2", "10.244.2.2"), why: "none: this node has no topology.kubernetes.io/zone label",
		},
		{
			name: "hints without a trafficDistribution are used, as by kube-proxy",
			eps:  []ep{a, b}, cluster: hostPorts("10.244.1.2"), why: "node hints for n1",
		},
		{
			name: "no hints, nothing asked: nothing to say",
			eps:  []ep{noHints(a), noHints(b)}, cluster: hostPorts("10.244.1.2", "10.244.2.2"), why: "",
		},
		{
			name: "asked, but no hints yet: none",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{noHints(a), noHints(b)},
			cluster: hostPorts("10.244.1.2", "10.244.2.2"), why: "none: no endpoint has hints",
		},
		{
			name: "unready endpoints do not count: their missing hints neither",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{a, b, unready(noHints(c))},
			cluster: hostPorts("10.244.1.2"), why: "node hints for n1",
		},
		{
			name: "the endpoint for this node unready: zone hints of the ready ones",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{unready(a), b, c},
			cluster: hostPorts("10.244.3.2"), why: "zone hints for z1",
		},
		{
			name: "no ready endpoint: serving terminating ones, hints aside",
			mut:  dist(v1.ServiceTrafficDistributionPreferSameNode), eps: []ep{terminating(a), terminating(b)},
			cluster: hostPorts("10.244.1.2", "10.244.2.2"), why: "none: no ready endpoint",
		},
		{
			name:    "externalTrafficPolicy Local: topology narrows the Cluster endpoints, not the local ones",
			mut:     nodePort(v1.ServiceExternalTrafficPolicyLocal),
			eps:     []ep{a, local(ep{ip: "10.244.1.3", nodes: []string{"n9"}, zones: []string{"z9"}}), b},
			cluster: hostPorts("10.244.1.2"), local: hostPorts("10.244.1.2", "10.244.1.3"), why: "node hints for n1",
		},
		{
			name: "externalTrafficPolicy Cluster: the same",
			mut:  nodePort(v1.ServiceExternalTrafficPolicyCluster), eps: []ep{a, b},
			cluster: hostPorts("10.244.1.2"), why: "node hints for n1",
		},
		{
			name: "internalTrafficPolicy Local, internal only: no topology",
			mut:  itpLocal, eps: []ep{zoneOnly(a), zoneOnly(local(b))},
			cluster: hostPorts("10.244.1.2", "10.244.2.2"), local: hostPorts("10.244.1.2", "10.244.2.2"),
			why: "none: internalTrafficPolicy Local*",
		},
		{
			name: "internalTrafficPolicy Local with a node port: topology narrows the Cluster endpoints external traffic uses",
			mut: func(s *v1.Service) {
				itpLocal(s)
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
			},
			eps:     []ep{zoneOnly(a), zoneOnly(local(b)), zoneOnly(c)},
			cluster: hostPorts("10.244.1.2", "10.244.3.2"), local: hostPorts("10.244.1.2", "10.244.2.2"), why: "zone hints for z1",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := buildTestConfig()
			switch tc.zone {
			case "":
			case "-":
				cfg.NodeZone = ""
			default:
				cfg.NodeZone = tc.zone
			}
			s, problems := cfg.Build(svc(tc.mut), []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080, tc.eps...)})
			if len(problems) > 0 {
				t.Fatalf("problems: %v", problems)
			}
			p := s.Portals[0]
			if !slices.Equal(p.ClusterEndpoints, tc.cluster) {
				t.Errorf("cluster endpoints %v, want %v", p.ClusterEndpoints, tc.cluster)
			}
			if tc.local != nil && !slices.Equal(p.LocalEndpoints, tc.local) {
				t.Errorf("local endpoints %v, want %v", p.LocalEndpoints, tc.local)
			}
			if want, prefix := strings.CutSuffix(tc.why, "*"); prefix && !strings.HasPrefix(p.Topology, want) || !prefix && p.Topology != want {
				t.Errorf("topology %q, want %q", p.Topology, tc.why)
			}
		})
	}
}

// A change of topology alone is a change of the portal: dump-rules reads
// it from the kernel.
func TestTopologyChangesPortal(t *testing.T) {
	p := &Portal{Topology: "node hints for n1"}
	q := &Portal{Topology: "zone hints for z1"}
	if p.Equal(q) {
		t.Error("portals that differ in topology are Equal")
	}
}
