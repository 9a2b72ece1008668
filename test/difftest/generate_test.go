package difftest

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The same seed draws the same case, and every case keeps the rules the
// API server and the twins rely on: addresses and NodePorts unique within
// the case, one cluster IP per IP family in that family's band, the
// family policy matching the families, externalIPs, load-balancer IPs and
// source ranges of the Service's families, EndpointSlices per family with
// the pods' addresses of it, a port at most once per protocol, traffic
// policies only where the API allows them. Over the seeds every family
// policy and order is drawn.
func TestGenerateReproducibleAndValid(t *testing.T) {
	drawn := map[string]int{}
	for seed := range uint64(2000) {
		c := generate(seed)
		if got, again := c.YAML(), generate(seed).YAML(); got != again {
			t.Fatalf("seed %d draws two cases:\n%s\n---- and ----\n%s", seed, got, again)
		}
		nodePorts, ips := map[int32]bool{}, map[string]bool{}
		for _, s := range c.Services {
			spec := s.Service.Spec
			name := s.Service.Name
			families := checkFamilies(t, seed, s)
			drawn[fmt.Sprintf("%s %v", *spec.IPFamilyPolicy, spec.IPFamilies)]++
			for _, ip := range append(append(append([]string(nil), spec.ClusterIPs...), spec.ExternalIPs...), s.Ingress...) {
				if ips[ip] {
					t.Errorf("seed %d: %s used twice", seed, ip)
				}
				ips[ip] = true
			}
			for _, ip := range append(append([]string(nil), spec.ExternalIPs...), s.Ingress...) {
				if !families[family(netip.MustParseAddr(ip))] {
					t.Errorf("seed %d: %s external or load-balancer IP %s not of its families %v", seed, name, ip, spec.IPFamilies)
				}
			}
			for _, r := range spec.LoadBalancerSourceRanges {
				if !families[family(netip.MustParsePrefix(r).Addr())] {
					t.Errorf("seed %d: %s source range %s not of its families %v", seed, name, r, spec.IPFamilies)
				}
			}
			ports := map[string]bool{}
			for _, p := range spec.Ports {
				key := fmt.Sprintf("%s/%d", p.Protocol, p.Port)
				if ports[key] || p.Port == undefinedPort {
					t.Errorf("seed %d: %s port %v repeated or undefinedPort", seed, name, p)
				}
				ports[key] = true
				if (p.NodePort != 0) != (spec.Type != v1.ServiceTypeClusterIP) {
					t.Errorf("seed %d: %s type %s with NodePort %d", seed, name, spec.Type, p.NodePort)
				}
				if p.NodePort != 0 && nodePorts[p.NodePort] {
					t.Errorf("seed %d: NodePort %d twice", seed, p.NodePort)
				}
				nodePorts[p.NodePort] = true
			}
			if spec.ExternalTrafficPolicy != "" && spec.Type == v1.ServiceTypeClusterIP {
				t.Errorf("seed %d: %s ClusterIP with externalTrafficPolicy", seed, name)
			}
			pods := map[podRef]bool{}
			for _, e := range s.Endpoints {
				if pods[e.Pod] {
					t.Errorf("seed %d: %s lists %s twice", seed, name, e.Pod.Name())
				}
				pods[e.Pod] = true
			}
			checkSlices(t, seed, s)
		}
	}
	for _, want := range []string{
		"SingleStack [IPv4]", "SingleStack [IPv6]",
		"PreferDualStack [IPv4 IPv6]", "PreferDualStack [IPv6 IPv4]",
		"RequireDualStack [IPv4 IPv6]", "RequireDualStack [IPv6 IPv4]",
	} {
		if drawn[want] == 0 {
			t.Errorf("no Service of %s in 2000 seeds (drawn: %v)", want, drawn)
		}
	}
}

// checkFamilies checks s's family policy, families and cluster IPs, and
// returns its families as a set.
func checkFamilies(t *testing.T, seed uint64, s *ServiceCase) map[v1.IPFamily]bool {
	t.Helper()
	spec := s.Service.Spec
	name := s.Service.Name
	if spec.IPFamilyPolicy == nil {
		t.Fatalf("seed %d: %s without ipFamilyPolicy", seed, name)
	}
	if single := *spec.IPFamilyPolicy == v1.IPFamilyPolicySingleStack; single != (len(spec.IPFamilies) == 1) ||
		len(spec.IPFamilies) < 1 || len(spec.IPFamilies) > 2 || len(spec.ClusterIPs) != len(spec.IPFamilies) {
		t.Fatalf("seed %d: %s policy %s, families %v, cluster IPs %v", seed, name, *spec.IPFamilyPolicy, spec.IPFamilies, spec.ClusterIPs)
	}
	if spec.ClusterIP != spec.ClusterIPs[0] {
		t.Errorf("seed %d: %s clusterIP %s is not clusterIPs[0] %s", seed, name, spec.ClusterIP, spec.ClusterIPs[0])
	}
	families := map[v1.IPFamily]bool{}
	for i, f := range spec.IPFamilies {
		if families[f] {
			t.Errorf("seed %d: %s family %s twice", seed, name, f)
		}
		families[f] = true
		ip := netip.MustParseAddr(spec.ClusterIPs[i])
		band := map[v1.IPFamily]netip.Prefix{v1.IPv4Protocol: serviceBand, v1.IPv6Protocol: serviceBand6}[f]
		if family(ip) != f || !band.Contains(ip) {
			t.Errorf("seed %d: %s %s cluster IP %s outside %s", seed, name, f, ip, band)
		}
	}
	return families
}

// checkSlices checks that s's EndpointSlices list each endpoint once per
// family of s (twice for the duplicate), with the pod's address of it.
func checkSlices(t *testing.T, seed uint64, s *ServiceCase) {
	t.Helper()
	listed := map[discoveryv1.AddressType]map[string]int{}
	for _, sl := range s.slices() {
		if listed[sl.AddressType] == nil {
			listed[sl.AddressType] = map[string]int{}
		}
		for _, e := range sl.Endpoints {
			listed[sl.AddressType][e.Addresses[0]]++
		}
	}
	if len(listed) > len(s.Service.Spec.IPFamilies) {
		t.Errorf("seed %d: %s slices of %d address types for families %v", seed, s.Service.Name, len(listed), s.Service.Spec.IPFamilies)
	}
	for _, f := range s.Service.Spec.IPFamilies {
		n := 0
		for _, e := range s.Endpoints {
			if listed[discoveryv1.AddressType(f)][e.Pod.IPOf(f).String()] == 0 {
				t.Errorf("seed %d: %s %s slices lack %s", seed, s.Service.Name, f, e.Pod.IPOf(f))
			}
			n++
		}
		if s.Duplicate && s.Split > 0 {
			n++
		}
		total := 0
		for _, k := range listed[discoveryv1.AddressType(f)] {
			total += k
		}
		if total != n {
			t.Errorf("seed %d: %s %s slices list %d endpoints, want %d", seed, s.Service.Name, f, total, n)
		}
	}
}

// Every way in of both families is probed: each cluster IP on each port
// and on the undefined port, each NodePort on each node's IPv4 and IPv6
// address, each externalIP and load-balancer IP on each port, and an
// unallocated cluster IP of each family; the outside client only where it
// can be routed.
func TestProbesCoverBothFamilies(t *testing.T) {
	for seed := range uint64(500) {
		c := generate(seed)
		probed := map[string]bool{}
		for _, p := range c.probes() {
			probed[p.To.Proto+" "+p.To.Addr] = true
			if p.From.Outside && !p.To.Outside {
				t.Errorf("seed %d: the outside client probes %s", seed, p.To)
			}
		}
		want := []string{"tcp " + hostPort(unallocatedIP.String(), 80), "tcp " + hostPort(unallocatedIP6.String(), 80)}
		for _, s := range c.Services {
			spec := s.Service.Spec
			for _, p := range spec.Ports {
				pr := proto(p.Protocol)
				for _, ip := range append(append(append([]string(nil), spec.ClusterIPs...), spec.ExternalIPs...), s.Ingress...) {
					want = append(want, pr+" "+hostPort(ip, p.Port))
				}
				for n := 1; p.NodePort != 0 && n <= nodes; n++ {
					want = append(want, pr+" "+hostPort(nodeIP(n).String(), p.NodePort), pr+" "+hostPort(nodeIP6(n).String(), p.NodePort))
				}
			}
			for _, ip := range spec.ClusterIPs {
				want = append(want, proto(spec.Ports[0].Protocol)+" "+hostPort(ip, undefinedPort))
			}
		}
		for _, w := range want {
			if !probed[w] {
				t.Errorf("seed %d: no probe to %s", seed, w)
			}
		}
	}
}
