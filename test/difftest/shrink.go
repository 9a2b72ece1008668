package difftest

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// maxShrinkRuns and maxShrinkTime bound how many smaller cases shrinking
// tries, and for how long.
const (
	maxShrinkRuns = 30
	maxShrinkTime = 2 * time.Minute
)

// shrink looks for a smaller case that still shows a failing difference:
// it drops one Service, one port, one endpoint or one optional feature (an
// IP family of a dual-stack Service among them) at a time, keeping each smaller case that still fails, until none does or
// maxShrinkRuns cases were tried. It returns the smallest failing case
// and its differences.
func (r *runner) shrink(ctx context.Context, c *Case, diffs []difference) (*Case, []difference, error) {
	runs, deadline := 0, time.Now().Add(maxShrinkTime)
	for {
		smaller := false
		for _, cand := range smallerCases(c) {
			if runs >= maxShrinkRuns || time.Now().After(deadline) {
				return c, diffs, nil
			}
			runs++
			got, err := r.run(ctx, cand.c)
			if err != nil {
				return c, diffs, err
			}
			if f := failing(got); len(f) > 0 {
				r.log.Info("shrunk", "seed", c.Seed, "dropped", cand.what, "failing", len(f))
				c, diffs, smaller = cand.c, got, true
				break
			}
		}
		if !smaller {
			return c, diffs, nil
		}
	}
}

type candidate struct {
	what string
	c    *Case
}

// smallerCases lists c with one thing fewer, the biggest cuts first.
func smallerCases(c *Case) []candidate {
	var out []candidate
	for i := range c.Services {
		if len(c.Services) > 1 {
			n := c.clone()
			n.Services = append(n.Services[:i], n.Services[i+1:]...)
			out = append(out, candidate{"Service " + c.Services[i].Service.Name, n})
		}
	}
	for i, s := range c.Services {
		for j := range s.Service.Spec.Ports {
			if len(s.Service.Spec.Ports) > 1 {
				n := c.clone()
				spec := &n.Services[i].Service.Spec
				spec.Ports = append(spec.Ports[:j], spec.Ports[j+1:]...)
				out = append(out, candidate{fmt.Sprintf("%s port %s", s.Service.Name, s.Service.Spec.Ports[j].Name), n})
			}
		}
		for k, e := range s.Endpoints {
			n := c.clone()
			n.Services[i].Endpoints = append(n.Services[i].Endpoints[:k], n.Services[i].Endpoints[k+1:]...)
			out = append(out, candidate{fmt.Sprintf("%s endpoint %s", s.Service.Name, e.Pod.Name()), n})
		}
		for _, f := range optional {
			if n := c.clone(); f.drop(n.Services[i]) {
				out = append(out, candidate{s.Service.Name + " " + f.name, n})
			}
		}
	}
	return out
}

// optional are the features shrinking tries without; drop reports whether
// s had the feature.
var optional = []struct {
	name string
	drop func(s *ServiceCase) bool
}{
	{"externalIPs", func(s *ServiceCase) bool {
		had := len(s.Service.Spec.ExternalIPs) > 0
		s.Service.Spec.ExternalIPs = nil
		return had
	}},
	{"loadBalancerSourceRanges", func(s *ServiceCase) bool {
		had := len(s.Service.Spec.LoadBalancerSourceRanges) > 0
		s.Service.Spec.LoadBalancerSourceRanges = nil
		return had
	}},
	{"session affinity", func(s *ServiceCase) bool {
		had := s.Service.Spec.SessionAffinity != "" && s.Service.Spec.SessionAffinity != "None"
		s.Service.Spec.SessionAffinity, s.Service.Spec.SessionAffinityConfig = "", nil
		return had
	}},
	{"trafficDistribution", func(s *ServiceCase) bool {
		had := s.Service.Spec.TrafficDistribution != nil
		s.Service.Spec.TrafficDistribution = nil
		return had
	}},
	{"second EndpointSlice", func(s *ServiceCase) bool {
		had := s.Split > 0
		s.Split, s.Duplicate = 0, false
		return had
	}},
	{"IPv4 family", func(s *ServiceCase) bool { return s.dropFamily(v1.IPv4Protocol) }},
	{"IPv6 family", func(s *ServiceCase) bool { return s.dropFamily(v1.IPv6Protocol) }},
	{"labels", func(s *ServiceCase) bool {
		had := len(s.Service.Labels) > 0
		s.Service.Labels = nil
		return had
	}},
}

// dropFamily makes a dual-stack s single-stack of its other family: its
// cluster IP, externalIPs, load-balancer IPs and source ranges of family f
// go. It reports whether s was dual-stack.
func (s *ServiceCase) dropFamily(f v1.IPFamily) bool {
	spec := &s.Service.Spec
	if len(spec.IPFamilies) < 2 {
		return false
	}
	keep := func(ips []string) []string {
		var out []string
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip); err == nil && family(a) != f {
				out = append(out, ip)
			} else if p, err := netip.ParsePrefix(ip); err == nil && family(p.Addr()) != f {
				out = append(out, ip)
			}
		}
		return out
	}
	for i, fam := range spec.IPFamilies {
		if fam != f {
			spec.IPFamilies, spec.ClusterIPs = []v1.IPFamily{fam}, []string{spec.ClusterIPs[i]}
			break
		}
	}
	spec.ClusterIP, spec.IPFamilyPolicy = spec.ClusterIPs[0], ptr.To(v1.IPFamilyPolicySingleStack)
	spec.ExternalIPs, s.Ingress, spec.LoadBalancerSourceRanges = keep(spec.ExternalIPs), keep(s.Ingress), keep(spec.LoadBalancerSourceRanges)
	return true
}
