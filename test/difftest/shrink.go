package difftest

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"slices"

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
// IP family of a dual-stack Service among them) at a time, keeping each
// smaller case that still fails, until none does or maxShrinkRuns cases
// were tried. It returns the smallest failing case and its differences.
func (r *runner) shrink(ctx context.Context, c *Case, diffs []difference) (*Case, []difference, error) {
	small, _, got, err := r.shrinkSteps(ctx, c, nil, diffs)
	return small, got, err
}

// shrinkSteps is shrink for a case that differs after its changes
// (steps, the last of which differs): a cut drops the same Service, port,
// endpoint or feature from the first state and from the state after every
// change, and a change before the last may be dropped too (the state
// before it then goes straight to the state after it). A smaller sequence
// is kept when some step of it still fails. It returns the smallest
// sequence found and the differences of its failing step.
func (r *runner) shrinkSteps(ctx context.Context, c *Case, steps []step, diffs []difference) (*Case, []step, []difference, error) {
	runs, deadline := 0, time.Now().Add(maxShrinkTime)
	for {
		smaller := false
		for _, cand := range smallerSequences(c, steps) {
			if runs >= maxShrinkRuns || time.Now().After(deadline) {
				return c, steps, diffs, nil
			}
			runs++
			got, at, err := r.runSteps(ctx, cand.c, cand.steps)
			if err != nil {
				return c, steps, diffs, err
			}
			if f := failing(got); len(f) > 0 {
				r.log.Info("shrunk", "seed", c.Seed, "dropped", cand.what, "failing", len(f), "changes", at)
				c, steps, diffs, smaller = cand.c, cand.steps[:at], got, true
				break
			}
		}
		if !smaller {
			return c, steps, diffs, nil
		}
	}
}

type candidate struct {
	what  string
	c     *Case
	steps []step
}

// smallerSequences lists c and its steps with one thing fewer, the
// biggest cuts first: a change before the last, then each cut of any
// state (cuts) applied to every state.
func smallerSequences(c *Case, steps []step) []candidate {
	var out []candidate
	for k := 0; k+1 < len(steps); k++ {
		out = append(out, candidate{"change " + steps[k].What, c.clone(), append(slices.Clone(steps[:k]), steps[k+1:]...)})
	}
	seen := map[string]bool{}
	for _, state := range append([]*Case{c}, stepStates(steps)...) {
		for _, ct := range cuts(state) {
			if seen[ct.what] {
				continue
			}
			seen[ct.what] = true
			n := ct.apply(c.clone())
			changed := n.changed
			var ns []step
			for _, st := range steps {
				m := ct.apply(st.Next.clone())
				changed = changed || m.changed
				ns = append(ns, step{st.What, m.c})
			}
			if changed && !emptySequence(n.c, ns) {
				out = append(out, candidate{ct.what, n.c, ns})
			}
		}
	}
	return out
}

func stepStates(steps []step) []*Case {
	var out []*Case
	for _, st := range steps {
		out = append(out, st.Next)
	}
	return out
}

// emptySequence: no state of the sequence holds a Service.
func emptySequence(c *Case, steps []step) bool {
	if len(c.Services) > 0 {
		return false
	}
	for _, st := range steps {
		if len(st.Next.Services) > 0 {
			return false
		}
	}
	return true
}

// cut drops one named thing from any state that has it.
type cut struct {
	what string
	fn   func(c *Case) bool // drops it from c, reports whether c had it
}

type cutResult struct {
	c       *Case
	changed bool
}

func (ct cut) apply(c *Case) cutResult { return cutResult{c, ct.fn(c)} }

// cuts lists what can be dropped from c, by name: a Service, a port of
// one, an endpoint (by its pod), an optional feature.
func cuts(c *Case) []cut {
	var out []cut
	for _, s := range c.Services {
		name := s.Service.Name
		out = append(out, cut{"Service " + name, func(c *Case) bool {
			n := len(c.Services)
			c.Services = slices.DeleteFunc(c.Services, func(x *ServiceCase) bool { return x.Service.Name == name })
			return len(c.Services) < n
		}})
	}
	for _, s := range c.Services {
		name := s.Service.Name
		for _, p := range s.Service.Spec.Ports {
			port := p.Name
			out = append(out, cut{fmt.Sprintf("%s port %s", name, port), func(c *Case) bool {
				x := c.service(name)
				if x == nil || len(x.Service.Spec.Ports) < 2 {
					return false
				}
				n := len(x.Service.Spec.Ports)
				x.Service.Spec.Ports = slices.DeleteFunc(x.Service.Spec.Ports, func(q v1.ServicePort) bool { return q.Name == port })
				return len(x.Service.Spec.Ports) < n
			}})
		}
		for _, e := range s.Endpoints {
			pod := e.Pod
			out = append(out, cut{fmt.Sprintf("%s endpoint %s", name, pod.Name()), func(c *Case) bool {
				x := c.service(name)
				if x == nil {
					return false
				}
				n := len(x.Endpoints)
				x.Endpoints = slices.DeleteFunc(x.Endpoints, func(q Endpoint) bool { return q.Pod == pod })
				return len(x.Endpoints) < n
			}})
		}
		for _, f := range optional {
			out = append(out, cut{name + " " + f.name, func(c *Case) bool {
				x := c.service(name)
				return x != nil && f.drop(x)
			}})
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
