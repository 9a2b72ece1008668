package difftest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// step is one change to a case: the state after it, and what changed.
type step struct {
	What string
	Next *Case
}

// changes draws 0 to 2 changes to c from seed, each from the state before
// it: scale up, down or to zero, delete (and sometimes recreate), flip a
// traffic policy, terminate a pod, change affinity. They come from a
// stream of their own, so a seed's first state is generate's.
func changes(seed uint64, c *Case) []step {
	g := &generator{r: rand.New(rand.NewPCG(seed, 0x6368616e6765)), nodePorts: map[int32]bool{}, ips: map[netip.Addr]bool{}}
	for _, s := range c.Services {
		for _, p := range s.Service.Spec.Ports {
			g.nodePorts[p.NodePort] = true
		}
		g.nodePorts[s.Service.Spec.HealthCheckNodePort] = true
	}
	var out []step
	cur := c
	for range g.r.IntN(3) {
		for _, st := range g.change(cur) {
			out = append(out, st)
			cur = st.Next
		}
	}
	return out
}

// change draws one change to one Service of c (two steps for a delete and
// recreate); none when the drawn change does not apply.
func (g *generator) change(c *Case) []step {
	if len(c.Services) == 0 {
		return nil
	}
	i := g.r.IntN(len(c.Services))
	next := c.clone()
	s := next.Services[i]
	name, spec := s.Service.Name, &s.Service.Spec
	switch g.r.IntN(8) {
	case 0:
		in := map[podRef]bool{}
		for _, e := range s.Endpoints {
			in[e.Pod] = true
		}
		for _, p := range allPods() {
			if !in[p] {
				s.Endpoints = append(s.Endpoints, Endpoint{Pod: p, Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)})
				return []step{{fmt.Sprintf("%s scaled up: %s added", name, p.Name()), next}}
			}
		}
	case 1:
		if n := len(s.Endpoints); n > 0 {
			k := g.r.IntN(n)
			gone := s.Endpoints[k].Pod
			s.Endpoints = append(s.Endpoints[:k], s.Endpoints[k+1:]...)
			return []step{{fmt.Sprintf("%s scaled down: %s removed", name, gone.Name()), next}}
		}
	case 2:
		if len(s.Endpoints) > 0 {
			s.Endpoints, s.Split, s.Duplicate = nil, 0, false
			return []step{{name + " scaled to zero", next}}
		}
	case 3:
		next.Services = append(next.Services[:i], next.Services[i+1:]...)
		out := []step{{name + " deleted", next}}
		if g.chance(0.5) {
			out = append(out, step{name + " recreated", c.clone()})
		}
		return out
	case 4:
		if spec.Type == v1.ServiceTypeClusterIP {
			return nil
		}
		if spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
			spec.ExternalTrafficPolicy, spec.HealthCheckNodePort = v1.ServiceExternalTrafficPolicyCluster, 0
		} else {
			spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			if spec.Type == v1.ServiceTypeLoadBalancer {
				spec.HealthCheckNodePort = g.nodePort()
			}
		}
		return []step{{fmt.Sprintf("%s externalTrafficPolicy now %s", name, spec.ExternalTrafficPolicy), next}}
	case 5:
		p := v1.ServiceInternalTrafficPolicyLocal
		if spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == p {
			p = v1.ServiceInternalTrafficPolicyCluster
		}
		spec.InternalTrafficPolicy = &p
		return []step{{fmt.Sprintf("%s internalTrafficPolicy now %s", name, p), next}}
	case 6:
		if n := len(s.Endpoints); n > 0 && !spec.PublishNotReadyAddresses {
			k := g.r.IntN(n)
			s.Endpoints[k].Ready, s.Endpoints[k].Serving, s.Endpoints[k].Terminating = ptr.To(false), ptr.To(true), ptr.To(true)
			return []step{{fmt.Sprintf("%s: %s terminating", name, s.Endpoints[k].Pod.Name()), next}}
		}
	case 7:
		if spec.SessionAffinity == v1.ServiceAffinityClientIP {
			spec.SessionAffinity, spec.SessionAffinityConfig = v1.ServiceAffinityNone, nil
		} else {
			spec.SessionAffinity = v1.ServiceAffinityClientIP
			spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(10800))}}
		}
		return []step{{fmt.Sprintf("%s sessionAffinity now %s", name, spec.SessionAffinity), next}}
	}
	return nil
}
