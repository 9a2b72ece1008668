package portal

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// The annotation chooses; without it the cluster's default applies; an
// unknown value is reported (a Kubernetes event on the Service) and the
// default applies. Every port and family of the Service carries the choice.
func TestBalancingAnnotation(t *testing.T) {
	annotated := func(v string) *v1.Service {
		return svc(func(s *v1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
			s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP})
			if v != "-" {
				s.Annotations = map[string]string{AnnotationBalancing: v}
			}
		})
	}
	eps := []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"})}
	for _, c := range []struct {
		value       string
		def         Balancing
		want        Balancing
		wantProblem bool
	}{
		{"-", BalancingRandom, BalancingRandom, false},
		{"-", BalancingMaglev, BalancingMaglev, false},
		{"maglev", BalancingRandom, BalancingMaglev, false},
		{"random", BalancingMaglev, BalancingRandom, false},
		{"Maglev", BalancingRandom, BalancingRandom, true},
		{"", BalancingMaglev, BalancingMaglev, true},
		{"hash", BalancingMaglev, BalancingMaglev, true},
	} {
		cfg := buildTestConfig()
		cfg.Balancing = c.def
		s, problems := cfg.Build(annotated(c.value), eps)
		if len(s.Portals) != 4 {
			t.Fatalf("%q: %d portals, want 4", c.value, len(s.Portals))
		}
		for _, p := range s.Portals {
			if p.Balancing != c.want {
				t.Errorf("annotation %q, default %s: portal %s balances by %s, want %s", c.value, c.def, p.Key, p.Balancing, c.want)
			}
		}
		var got []Problem
		for _, p := range problems {
			if p.Reason == ReasonInvalidBalancing {
				got = append(got, p)
			}
		}
		switch {
		case c.wantProblem && (len(got) != 1 || !strings.Contains(got[0].Message, `"`+c.value+`"`)):
			t.Errorf("annotation %q: problems %v, want one %s naming the value", c.value, problems, ReasonInvalidBalancing)
		case !c.wantProblem && len(problems) != 0:
			t.Errorf("annotation %q: problems %v, want none", c.value, problems)
		}
	}
}

// A change of balancing is a change of the portal: the dataplane is told.
func TestBalancingChangesThePortal(t *testing.T) {
	cfg := buildTestConfig()
	a, _ := cfg.Build(svc(nil), nil)
	b, _ := cfg.Build(svc(func(s *v1.Service) { s.Annotations = map[string]string{AnnotationBalancing: "maglev"} }), nil)
	if a.Equal(b) {
		t.Errorf("a Service with and without maglev balancing are Equal")
	}
}

func TestParseBalancing(t *testing.T) {
	for _, b := range []Balancing{BalancingRandom, BalancingMaglev} {
		if got, ok := ParseBalancing(b.String()); !ok || got != b {
			t.Errorf("ParseBalancing(%q) = %v, %v", b.String(), got, ok)
		}
	}
	if _, ok := ParseBalancing("round-robin"); ok {
		t.Errorf("round-robin parsed")
	}
}
