package portal

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// TestProblemReportedOncePerRefusal: a refusal that lasts while the
// Service's endpoints churn (a thousand slice changes, each a rebuild) is
// reported once, not once per rebuild; a second problem appearing is
// reported alone; a fix and a relapse report it again; a deleted and
// recreated Service starts afresh.
func TestProblemReportedOncePerRefusal(t *testing.T) {
	rep := &recordReporter{}
	tr := NewTracker(Config{NodeName: "n1", ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, rep, nil)
	refused := func(ips ...string) *v1.Service {
		return svc(func(s *v1.Service) { s.Spec.ExternalIPs = ips })
	}
	reasons := func() []string {
		var out []string
		for _, p := range rep.got {
			out = append(out, p.Reason+" "+p.Message)
		}
		rep.got = nil
		return out
	}
	tr.SetService(refused("198.51.100.7")) // outside externalIPCIDRs
	tr.Snapshot()
	if got := reasons(); len(got) != 1 {
		t.Fatalf("first build: reports %q, want one", got)
	}
	for i := range 1000 {
		tr.SetSlice(slice("web-a", discovery.AddressTypeIPv4, 8080, ep{ip: fmt.Sprintf("10.244.%d.%d", i/250, i%250+1), node: "n1"}))
		tr.Snapshot()
	}
	if got := reasons(); len(got) != 0 {
		t.Fatalf("1000 rebuilds of a lasting refusal: %d reports, want none: %q", len(got), got[:min(3, len(got))])
	}
	tr.SetService(refused("198.51.100.7", "198.51.100.8"))
	tr.Snapshot()
	if got := reasons(); len(got) != 1 {
		t.Errorf("a second refused address: reports %q, want only the new one", got)
	}
	tr.SetService(refused("203.0.113.9"))
	tr.Snapshot()
	if got := reasons(); len(got) != 0 {
		t.Errorf("fixed Service: reports %q, want none", got)
	}
	tr.SetService(refused("198.51.100.7"))
	tr.Snapshot()
	if got := reasons(); len(got) != 1 {
		t.Errorf("the refusal back after a fix: reports %q, want one", got)
	}
	tr.DeleteService("ns", "web")
	tr.Snapshot()
	tr.SetService(refused("198.51.100.7"))
	tr.Snapshot()
	if got := reasons(); len(got) != 1 {
		t.Errorf("recreated Service with the same refusal: reports %q, want one", got)
	}
}
