package portal

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Service whose build panics (here: a nil EndpointSlice, which no
// informer hands out, standing for any object the builder chokes on) gets
// no portals and a Problem with the panic; the address it claimed goes to
// the next claimant, and every other Service is built as usual.
func TestTrackerConfinesAPanicToItsService(t *testing.T) {
	rep := &recordReporter{}
	tr := NewTracker(Config{NodeName: "n1", ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, rep, nil)
	bad := svc(func(s *v1.Service) {
		s.Name = "bad"
		s.CreationTimestamp = metav1.Unix(100, 0)
		s.Spec.ExternalIPs = []string{"203.0.113.5"}
	})
	good := svc(func(s *v1.Service) {
		s.Name = "good"
		s.CreationTimestamp = metav1.Unix(200, 0)
		s.Spec.ClusterIPs = []string{"10.96.0.11"}
		s.Spec.ExternalIPs = []string{"203.0.113.5"}
	})
	tr.SetService(bad)
	tr.SetService(good)
	kbad, kgood := ServiceKey{"ns", "bad"}, ServiceKey{"ns", "good"}
	tr.mu.Lock()
	tr.slices[kbad] = map[string]*discovery.EndpointSlice{"broken": nil}
	tr.mu.Unlock()

	snap, _ := tr.Snapshot()
	if s, ok := snap.Services[kbad]; ok {
		t.Errorf("the Service whose build panicked must get no portals, got %+v", s)
	}
	g := snap.Services[kgood]
	if g == nil || len(g.Portals) != 1 || len(g.Portals[0].ExternalIPs) != 1 {
		t.Fatalf("the other Service must be built with 203.0.113.5, got %+v", g)
	}
	var panics []Problem
	for _, p := range rep.got {
		if p.Reason == ReasonPanic {
			panics = append(panics, p)
		}
	}
	if len(panics) != 1 || panics[0].Service != kbad || panics[0].Panic == nil || len(panics[0].Panic.Stack) == 0 {
		t.Fatalf("want one %s Problem on %s with the panic, got %+v", ReasonPanic, kbad, rep.got)
	}
	if !strings.Contains(panics[0].Message, "endpoints.go") {
		t.Errorf("the message must say where it panicked, got %q", panics[0].Message)
	}

	// Fixed, it is built again.
	tr.mu.Lock()
	delete(tr.slices, kbad)
	tr.mu.Unlock()
	tr.SetService(bad)
	snap, _ = tr.Snapshot()
	if s := snap.Services[kbad]; s == nil || len(s.Portals) != 1 {
		t.Errorf("once fixed, the Service must be built, got %+v", s)
	}
}

func TestCatch(t *testing.T) {
	if err := Catch(func() {}); err != nil {
		t.Errorf("no panic: got %v", err)
	}
	var m map[string]int
	err := Catch(func() { m["x"]++ })
	if err == nil || !strings.Contains(err.Where, "portal.TestCatch") || !strings.Contains(err.Where, "safe_test.go:") {
		t.Errorf("want the panicking function and line, got %+v", err)
	}
	err = Catch(func() { panic(nil) })
	if err == nil {
		t.Error("panic(nil) must be caught too")
	}
}
