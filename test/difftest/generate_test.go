package difftest

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The same seed draws the same case, and every case keeps the rules the
// API server and the twins rely on: addresses and NodePorts unique within
// the case, cluster IPs in their band, a port at most once per protocol,
// traffic policies only where the API allows them.
func TestGenerateReproducibleAndValid(t *testing.T) {
	for seed := range uint64(2000) {
		c := generate(seed)
		if got, again := c.YAML(), generate(seed).YAML(); got != again {
			t.Fatalf("seed %d draws two cases:\n%s\n---- and ----\n%s", seed, got, again)
		}
		nodePorts, ips := map[int32]bool{}, map[string]bool{}
		for _, s := range c.Services {
			spec := s.Service.Spec
			if !serviceBand.Contains(netip.MustParseAddr(spec.ClusterIP)) {
				t.Errorf("seed %d: %s cluster IP %s outside %s", seed, s.Service.Name, spec.ClusterIP, serviceBand)
			}
			for _, ip := range append(append([]string{spec.ClusterIP}, spec.ExternalIPs...), s.Ingress...) {
				if ips[ip] {
					t.Errorf("seed %d: %s used twice", seed, ip)
				}
				ips[ip] = true
			}
			ports := map[string]bool{}
			for _, p := range spec.Ports {
				key := fmt.Sprintf("%s/%d", p.Protocol, p.Port)
				if ports[key] || p.Port == undefinedPort {
					t.Errorf("seed %d: %s port %v repeated or undefinedPort", seed, s.Service.Name, p)
				}
				ports[key] = true
				if (p.NodePort != 0) != (spec.Type != v1.ServiceTypeClusterIP) {
					t.Errorf("seed %d: %s type %s with NodePort %d", seed, s.Service.Name, spec.Type, p.NodePort)
				}
				if p.NodePort != 0 && nodePorts[p.NodePort] {
					t.Errorf("seed %d: NodePort %d twice", seed, p.NodePort)
				}
				nodePorts[p.NodePort] = true
			}
			if spec.ExternalTrafficPolicy != "" && spec.Type == v1.ServiceTypeClusterIP {
				t.Errorf("seed %d: %s ClusterIP with externalTrafficPolicy", seed, s.Service.Name)
			}
			pods := map[podRef]bool{}
			for _, e := range s.Endpoints {
				if pods[e.Pod] {
					t.Errorf("seed %d: %s lists %s twice", seed, s.Service.Name, e.Pod.Name())
				}
				pods[e.Pod] = true
			}
		}
	}
}
