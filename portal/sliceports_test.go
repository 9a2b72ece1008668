package portal

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// TestSlicePortWithoutName: a slice port with no name at all is ignored,
// as kube-proxy ignores it (the API server stores "" in its place, which is
// the unnamed Service port's).
func TestSlicePortWithoutName(t *testing.T) {
	s := svc(func(s *v1.Service) { s.Spec.Ports[0].Name = "" })
	for _, c := range []struct {
		name string
		port *string
		want int
	}{
		{"no name", nil, 0},
		{"empty name", ptr.To(""), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			es := slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"})
			es.Ports[0].Name = c.port
			cfg := buildTestConfig()
			built, _ := cfg.Build(s, []*discovery.EndpointSlice{es})
			if got := len(built.Portals[0].ClusterEndpoints); got != c.want {
				t.Errorf("%d endpoints, want %d", got, c.want)
			}
		})
	}
}
