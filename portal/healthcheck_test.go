package portal

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// TestHealthCheckWithoutWayIn: a LoadBalancer Service with
// externalTrafficPolicy: Local has its healthCheckNodePort, counting this
// node's ready endpoints, also when no family has a way in from outside
// (no node ports and only a Proxy-mode, hostname or no ingress), as
// kube-proxy serves it. A Cluster Service has none, whatever its spec
// says.
func TestHealthCheckWithoutWayIn(t *testing.T) {
	eps := slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2", node: "n1"}, ep{ip: "10.244.1.3", node: "n1"}, ep{ip: "10.244.2.2", node: "n2"})
	for _, c := range []struct {
		name    string
		ingress []v1.LoadBalancerIngress
		policy  v1.ServiceExternalTrafficPolicy
		wantHC  uint16
	}{
		{"no address published", nil, v1.ServiceExternalTrafficPolicyLocal, 32000},
		{"Proxy-mode ingress", []v1.LoadBalancerIngress{{IP: "203.0.113.7", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}}, v1.ServiceExternalTrafficPolicyLocal, 32000},
		{"hostname ingress", []v1.LoadBalancerIngress{{Hostname: "lb.example"}}, v1.ServiceExternalTrafficPolicyLocal, 32000},
		{"Cluster policy", nil, v1.ServiceExternalTrafficPolicyCluster, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
				s.Spec.ExternalTrafficPolicy = c.policy
				s.Spec.HealthCheckNodePort = 32000
				s.Status.LoadBalancer.Ingress = c.ingress
			})
			cfg := buildTestConfig()
			built, _ := cfg.Build(s, []*discovery.EndpointSlice{eps})
			if len(built.Portals) != 1 {
				t.Fatalf("portals %v", built.Portals)
			}
			p := built.Portals[0]
			if p.HasExternal() || p.ExternalLocal {
				t.Fatalf("a way in from outside: %+v", p)
			}
			if p.HealthCheckNodePort != c.wantHC {
				t.Errorf("healthCheckNodePort %d, want %d", p.HealthCheckNodePort, c.wantHC)
			}
			if want := map[bool]int{true: 2, false: 0}[c.wantHC != 0]; p.LocalReady != want {
				t.Errorf("local ready endpoints %d, want %d", p.LocalReady, want)
			}
		})
	}
}
