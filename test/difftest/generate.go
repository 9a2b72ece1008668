package difftest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
)

// Labels the proxies read on Services (and the headless one on their
// EndpointSlices): either makes both proxies leave the Service alone.
const (
	labelHeadless         = "service.kubernetes.io/headless"
	labelServiceProxyName = "service.kubernetes.io/service-proxy-name"
)

// generate draws a valid case from seed: 1 to 3 Services of type
// ClusterIP, NodePort or LoadBalancer, single-stack (IPv4 or IPv6) or
// dual-stack (either family first), each with 1 or 2 TCP or UDP ports and
// 0 to 3 endpoints. Each feature is one draw below, so adding one is a
// line or two: the same seed gives the same case as long as the draws
// before it are unchanged.
func generate(seed uint64) *Case {
	g := &generator{r: rand.New(rand.NewPCG(seed, 0x6f6e65686f70)), nodePorts: map[int32]bool{}, ips: map[netip.Addr]bool{}}
	c := &Case{Seed: seed}
	for i := range 1 + g.r.IntN(3) {
		c.Services = append(c.Services, g.service(fmt.Sprintf("svc-%d", i)))
	}
	return c
}

type generator struct {
	r         *rand.Rand
	nodePorts map[int32]bool
	ips       map[netip.Addr]bool
}

func (g *generator) chance(p float64) bool { return g.r.Float64() < p }

func pick[T any](g *generator, from ...T) T { return from[g.r.IntN(len(from))] }

func (g *generator) service(name string) *ServiceCase {
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1.ServiceSpec{
			Type: pick(g, v1.ServiceTypeClusterIP, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer),
		},
	}
	policy, families := g.ipFamilies()
	svc.Spec.IPFamilyPolicy, svc.Spec.IPFamilies = &policy, families
	for _, f := range families {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, g.clusterIP(f).String())
	}
	svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	s := &ServiceCase{Service: svc}
	spec := &svc.Spec

	nPorts := 1 + g.r.IntN(2)
	used := map[string]bool{}
	for i := 0; len(spec.Ports) < nPorts; i++ {
		p := v1.ServicePort{
			Name:     fmt.Sprintf("p%d", len(spec.Ports)),
			Protocol: pick(g, v1.ProtocolTCP, v1.ProtocolUDP),
			Port:     pick(g, int32(80), 81, 53, 443, 8080, 5353, 9000+g.r.Int32N(1000)),
		}
		key := fmt.Sprintf("%s/%d", p.Protocol, p.Port)
		if used[key] {
			continue
		}
		used[key] = true
		served := echoTCP
		if p.Protocol == v1.ProtocolUDP {
			served = echoUDP
		}
		target := pick(g, served...)
		if g.chance(0.1) {
			target = closedPort
		}
		p.TargetPort = intstr.FromInt32(int32(target))
		if spec.Type != v1.ServiceTypeClusterIP {
			p.NodePort = g.nodePort()
		}
		spec.Ports = append(spec.Ports, p)
	}

	if spec.Type != v1.ServiceTypeClusterIP {
		spec.ExternalTrafficPolicy = pick(g, v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal)
	}
	spec.InternalTrafficPolicy = ptr.To(pick(g, v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal))
	if g.chance(0.25) {
		spec.SessionAffinity = v1.ServiceAffinityClientIP
		spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(pick(g, int32(10800), 60, 1+g.r.Int32N(3600)))}}
	}
	if spec.Type == v1.ServiceTypeLoadBalancer {
		// A load balancer's IP per family, or of one family only.
		ingress := families
		if len(families) > 1 && g.chance(0.3) {
			ingress = []v1.IPFamily{pick(g, families...)}
		}
		for _, f := range ingress {
			s.Ingress = append(s.Ingress, g.externalIP(f, true).String())
		}
		if spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
			spec.HealthCheckNodePort = g.nodePort()
		}
		if g.chance(0.3) {
			spec.LoadBalancerSourceRanges = g.sourceRanges(families)
		}
	}
	if g.chance(0.25) {
		// Either half of an external range: the upper half is outside
		// the agent's --external-ip-cidrs. A dual-stack Service may have
		// one of each family.
		fs := []v1.IPFamily{pick(g, families...)}
		if len(families) > 1 && g.chance(0.3) {
			fs = families
		}
		for _, f := range fs {
			spec.ExternalIPs = append(spec.ExternalIPs, g.externalIP(f, g.chance(0.7)).String())
		}
	}
	if g.chance(0.05) {
		svc.Labels = map[string]string{labelServiceProxyName: "another-proxy"}
	}
	if g.chance(0.05) {
		svc.Labels = map[string]string{labelHeadless: ""}
	}
	if g.chance(0.1) {
		spec.PublishNotReadyAddresses = true
	}
	if g.chance(0.2) {
		spec.TrafficDistribution = ptr.To(pick(g, v1.ServiceTrafficDistributionPreferClose,
			v1.ServiceTrafficDistributionPreferSameZone, v1.ServiceTrafficDistributionPreferSameNode))
	}

	pods := allPods()
	g.r.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
	for _, p := range pods[:g.r.IntN(4)] {
		e := g.endpoint(p)
		if spec.PublishNotReadyAddresses {
			// The EndpointSlice controller then lists every pod as ready.
			e.Ready, e.Serving = ptr.To(true), ptr.To(true)
		}
		s.Endpoints = append(s.Endpoints, e)
	}
	if len(s.Endpoints) > 1 && g.chance(0.2) {
		s.Split = 1 + g.r.IntN(len(s.Endpoints)-1)
		s.Duplicate = g.chance(0.5)
	}
	return s
}

// endpoint draws one of the conditions a pod can be listed with: ready;
// not ready; terminating and still serving; terminating and not serving;
// or nothing set (an older controller, or another writer).
func (g *generator) endpoint(p podRef) Endpoint {
	t, f := ptr.To(true), ptr.To(false)
	switch g.r.IntN(10) {
	case 0, 1, 2, 3, 4:
		return Endpoint{Pod: p, Ready: t, Serving: t, Terminating: f}
	case 5, 6:
		return Endpoint{Pod: p, Ready: f, Serving: f, Terminating: f}
	case 7:
		return Endpoint{Pod: p, Ready: f, Serving: t, Terminating: t}
	case 8:
		return Endpoint{Pod: p, Ready: f, Serving: f, Terminating: t}
	default:
		return Endpoint{Pod: p}
	}
}

// ipFamilies draws a Service's ipFamilyPolicy and ipFamilies: single-stack
// IPv4 or IPv6, or PreferDualStack or RequireDualStack with either family
// first (the first is the Service's primary family: its spec.clusterIP).
func (g *generator) ipFamilies() (v1.IPFamilyPolicy, []v1.IPFamily) {
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	switch g.r.IntN(8) {
	case 0, 1:
		return v1.IPFamilyPolicySingleStack, []v1.IPFamily{v4}
	case 2, 3:
		return v1.IPFamilyPolicySingleStack, []v1.IPFamily{v6}
	case 4:
		return v1.IPFamilyPolicyPreferDualStack, []v1.IPFamily{v4, v6}
	case 5:
		return v1.IPFamilyPolicyPreferDualStack, []v1.IPFamily{v6, v4}
	case 6:
		return v1.IPFamilyPolicyRequireDualStack, []v1.IPFamily{v4, v6}
	default:
		return v1.IPFamilyPolicyRequireDualStack, []v1.IPFamily{v6, v4}
	}
}

// sourceRanges draws loadBalancerSourceRanges of the Service's families:
// a range per family, or for a dual-stack Service sometimes of one family
// only (the other family's load-balancer IP is then open to all).
func (g *generator) sourceRanges(families []v1.IPFamily) []string {
	fs := families
	if len(families) > 1 && g.chance(0.3) {
		fs = []v1.IPFamily{pick(g, families...)}
	}
	var out []string
	for _, f := range fs {
		if f == v1.IPv6Protocol {
			out = append(out, pick(g,
				clientIP6().String()+"/128", // the outside client alone
				netns.ClientCIDR6,           // the client's segment
				netns.ClusterCIDR6,          // pods only
				netns.NodeCIDR6,             // nodes only
				netns.ExternalCIDR6,         // no vantage point
			))
			continue
		}
		out = append(out, pick(g,
			netns.ClientIP().String()+"/32", // the outside client alone
			netns.ClientCIDR,                // the client's segment
			netns.ClusterCIDR,               // pods only
			netns.NodeCIDR,                  // nodes only
			netns.ExternalCIDR,              // no vantage point
		))
	}
	return out
}

// clusterIP draws an unused address of family f's serviceBand.
func (g *generator) clusterIP(f v1.IPFamily) netip.Addr {
	band := serviceBand
	if f == v1.IPv6Protocol {
		band = serviceBand6
	}
	host := band.Addr().BitLen() - band.Bits()
	for {
		ip := addHost(band.Addr(), g.r.Uint32N(1<<host-2)+1)
		if !g.ips[ip] {
			g.ips[ip] = true
			return ip
		}
	}
}

// addHost returns a with n added to its last 32 bits (n fits the host
// part of a's prefix, which is all zeros).
func addHost(a netip.Addr, n uint32) netip.Addr {
	b := a.AsSlice()
	l := len(b)
	b[l-4] |= byte(n >> 24)
	b[l-3] |= byte(n >> 16)
	b[l-2] |= byte(n >> 8)
	b[l-1] |= byte(n)
	out, _ := netip.AddrFromSlice(b)
	return out
}

// externalIP draws an unused address of family f's external range, in
// the half the agent allows or the other.
func (g *generator) externalIP(f v1.IPFamily, allowed bool) netip.Addr {
	for {
		n := 1 + g.r.IntN(126)
		ip := externalIP6(n, allowed)
		if f == v1.IPv4Protocol {
			if !allowed {
				n += 128
			}
			ip = netns.ExternalIP(n)
		}
		if !g.ips[ip] {
			g.ips[ip] = true
			return ip
		}
	}
}

// nodePort draws an unused port of the default NodePort range.
func (g *generator) nodePort() int32 {
	for {
		p := 30000 + g.r.Int32N(2768)
		if !g.nodePorts[p] {
			g.nodePorts[p] = true
			return p
		}
	}
}
