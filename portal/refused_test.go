package portal

import (
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestRefusedExternalIPsAreNotServed: an external IP the registry gives to
// someone else leaves the Service's portals (the Service is rebuilt, no
// problem of the model's own), its other external IPs stay, and it comes
// back once the refusal is lifted.
func TestRefusedExternalIPsAreNotServed(t *testing.T) {
	rep := &recordReporter{}
	tr := NewTracker(Config{NodeName: "n1", ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, rep, nil)
	k := ServiceKey{Namespace: "ns", Name: "web"}
	tr.SetService(svc(func(s *v1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.5", "203.0.113.6"} }))
	ips := func(what string) []netip.Addr {
		t.Helper()
		snap, _ := tr.Snapshot()
		s := snap.Services[k]
		if s == nil || len(s.Portals) != 1 {
			t.Fatalf("%s: built %+v", what, s)
		}
		return s.Portals[0].ExternalIPs
	}
	both := []netip.Addr{netip.MustParseAddr("203.0.113.5"), netip.MustParseAddr("203.0.113.6")}
	if got := ips("before"); !slices.Equal(got, both) {
		t.Fatalf("before any refusal: %v, want %v", got, both)
	}
	tr.SetRefusedExternalIPs(map[ServiceKey][]netip.Addr{k: {netip.MustParseAddr("203.0.113.5")}})
	if pending, _ := tr.Pending(); !pending {
		t.Error("a new refusal left nothing to rebuild")
	}
	if got := ips("refused"); !slices.Equal(got, both[1:]) {
		t.Errorf("with 203.0.113.5 refused: %v, want %v", got, both[1:])
	}
	tr.SetRefusedExternalIPs(map[ServiceKey][]netip.Addr{})
	if got := ips("lifted"); !slices.Equal(got, both) {
		t.Errorf("refusal lifted: %v, want %v", got, both)
	}
	if len(rep.got) != 0 {
		t.Errorf("the model reported %v; the registry reports refusals", rep.got)
	}
}
