package portal

import (
	"net/netip"
	"slices"
	"testing"

	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// TestHairpinIsThisNodesChosenEndpoints: only endpoints on this node that
// traffic can be sent to are listed (a pod elsewhere is translated on its
// own node, and one that is not chosen receives nothing), once each.
func TestHairpinIsThisNodesChosenEndpoints(t *testing.T) {
	cfg := buildTestConfig() // node n1
	notReady := ep{ip: "10.244.1.9", node: "n1", ready: ptr.To(false)}
	s, _ := cfg.Build(svc(nil), []*discovery.EndpointSlice{
		slice("a", discovery.AddressTypeIPv4, 8080,
			ep{ip: "10.244.1.3", node: "n1"}, ep{ip: "10.244.1.2", node: "n1"}, ep{ip: "10.244.2.2", node: "n2"}, notReady),
		slice("b", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2", node: "n1"}),
	})
	if s == nil || len(s.Portals) != 1 {
		t.Fatalf("built %+v", s)
	}
	want := []netip.Addr{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.1.3")}
	if got := s.Portals[0].Hairpin; !slices.Equal(got, want) {
		t.Errorf("Hairpin = %v, want %v", got, want)
	}
}
