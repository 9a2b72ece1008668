package portal

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ports(n int) []v1.ServicePort {
	out := make([]v1.ServicePort, n)
	for i := range out {
		out[i] = v1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(1 + i), Protocol: v1.ProtocolTCP}
	}
	return out
}

func repeat(n int, f func(i int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

func lbService(mut func(s *v1.Service)) *v1.Service {
	return svc(func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.7"}}
		if mut != nil {
			mut(s)
		}
	})
}

// A Service at a limit is built; one over it is refused whole, with one
// ServiceTooLarge Problem naming what is over, the limit and the field
// that changes it. Entries a Service does not use are not counted.
func TestLimits(t *testing.T) {
	small := Limits{Ports: 3, SourceRanges: 2, ExternalIPs: 2, LoadBalancerIPs: 1}
	extIP := func(i int) string { return fmt.Sprintf("203.0.113.%d", 1+i) }
	cidr := func(i int) string { return fmt.Sprintf("192.0.2.%d/32", i) }
	for _, c := range []struct {
		name   string
		limits Limits
		svc    *v1.Service
		over   string // "" when it must build
	}{
		{"ports at the limit", small, svc(func(s *v1.Service) { s.Spec.Ports = ports(3) }), ""},
		{"ports over", small, svc(func(s *v1.Service) { s.Spec.Ports = ports(4) }), "4 ports (at most 3, serviceLimits.ports)"},
		{"source ranges at the limit", small, lbService(func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = repeat(2, cidr) }), ""},
		{"source ranges over", small, lbService(func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = repeat(3, cidr) }),
			"3 loadBalancerSourceRanges (at most 2, serviceLimits.sourceRanges)"},
		{"source ranges of a Service that is no load balancer are not used", small,
			svc(func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = repeat(3, cidr) }), ""},
		{"external IPs over", small, svc(func(s *v1.Service) { s.Spec.ExternalIPs = repeat(3, extIP) }),
			"3 externalIPs (at most 2, serviceLimits.externalIPs)"},
		{"ingress IPs over", small, lbService(func(s *v1.Service) {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: "198.51.100.8"})
		}), "2 load-balancer ingress IPs (at most 1, serviceLimits.loadBalancerIPs)"},
		{"several over: all named", small, svc(func(s *v1.Service) { s.Spec.Ports = ports(4); s.Spec.ExternalIPs = repeat(3, extIP) }),
			"4 ports (at most 3, serviceLimits.ports), 3 externalIPs"},
		{"defaults: 5,000 ports and 10,000 ranges build", Limits{}, lbService(func(s *v1.Service) {
			s.Spec.Ports = ports(5000)
			s.Spec.LoadBalancerSourceRanges = repeat(10000, func(i int) string { return fmt.Sprintf("10.%d.%d.0/24", i>>8, i&255) })
		}), ""},
		{"defaults: 5,001 ports do not", Limits{}, svc(func(s *v1.Service) { s.Spec.Ports = ports(5001) }), "5001 ports (at most 5000"},
		{"a zero field takes the default", Limits{Ports: 2}, svc(func(s *v1.Service) { s.Spec.ExternalIPs = repeat(100, extIP) }), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := buildTestConfig()
			cfg.Limits = c.limits
			built, problems := cfg.Build(c.svc, nil)
			if c.over == "" {
				if built == nil {
					t.Fatalf("refused: %v", problems)
				}
				for _, p := range problems {
					if p.Reason == ReasonTooLarge {
						t.Errorf("built, yet reported %v", p)
					}
				}
				return
			}
			if built != nil {
				t.Errorf("over a limit, yet built with %d portals", len(built.Portals))
			}
			if len(problems) != 1 || problems[0].Reason != ReasonTooLarge || !strings.Contains(problems[0].Message, c.over) {
				t.Fatalf("want one %s Problem saying %q, got %v", ReasonTooLarge, c.over, problems)
			}
			if p := problems[0]; p.Service != (ServiceKey{"ns", "web"}) || !strings.Contains(p.Message, "not served") {
				t.Errorf("the Problem must be on the Service and say it is not served: %v", p)
			}
		})
	}
}

// A Service over a limit is left out, and only it: the others build, one
// takes the external IP the refused one held, the refusal is reported on
// the refused Service, and the Service is served again once it fits.
func TestTrackerRefusesOnlyTheServiceOverALimit(t *testing.T) {
	rep := &recordReporter{}
	cfg := buildTestConfig()
	cfg.Limits = Limits{Ports: 10}
	tr := NewTracker(cfg, rep, nil)
	big := svc(func(s *v1.Service) {
		s.Name = "big"
		s.CreationTimestamp = metav1.Unix(100, 0)
		s.Spec.ExternalIPs = []string{"203.0.113.5"}
	})
	other := svc(func(s *v1.Service) {
		s.Name = "other"
		s.CreationTimestamp = metav1.Unix(200, 0)
		s.Spec.ClusterIPs = []string{"10.96.0.11"}
		s.Spec.ExternalIPs = []string{"203.0.113.5"}
	})
	tr.SetService(big)
	tr.SetService(other)
	snap, _ := tr.Snapshot()
	kBig, kOther := ServiceKey{"ns", "big"}, ServiceKey{"ns", "other"}
	if snap.Services[kBig] == nil || len(snap.Services[kOther].Portals[0].ExternalIPs) != 0 {
		t.Fatalf("before: the older Service must hold the external IP")
	}

	grown := big.DeepCopy()
	grown.Spec.Ports = ports(11)
	rep.got = nil
	tr.SetService(grown)
	snap, _ = tr.Snapshot()
	if snap.Services[kBig] != nil {
		t.Errorf("a Service over the port limit is still served")
	}
	if got := snap.Services[kOther]; got == nil || len(got.Portals[0].ExternalIPs) != 1 {
		t.Errorf("the other Service must build and take the external IP the refused one let go: %+v", got)
	}
	var tooLarge []Problem
	for _, p := range rep.got {
		if p.Reason == ReasonTooLarge {
			tooLarge = append(tooLarge, p)
		}
	}
	if len(tooLarge) != 1 || tooLarge[0].Service != kBig {
		t.Errorf("want one %s on %v, got %v", ReasonTooLarge, kBig, rep.got)
	}

	shrunk := grown.DeepCopy()
	shrunk.Spec.Ports = ports(10)
	tr.SetService(shrunk)
	snap, _ = tr.Snapshot()
	if got := snap.Services[kBig]; got == nil || len(got.Portals) != 10 {
		t.Errorf("back under the limit, the Service must be served again: %+v", got)
	}
}
