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
// ClusterIP, NodePort or LoadBalancer, each with 1 or 2 TCP or UDP ports
// and 0 to 3 endpoints. Each feature is one draw below, so adding one is a
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
			Type:       pick(g, v1.ServiceTypeClusterIP, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer),
			ClusterIP:  g.clusterIP().String(),
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
		},
	}
	svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP}
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
		s.Ingress = []string{g.externalIP(true).String()}
		if spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
			spec.HealthCheckNodePort = g.nodePort()
		}
		if g.chance(0.3) {
			spec.LoadBalancerSourceRanges = []string{pick(g,
				netns.ClientIP().String()+"/32", // the outside client alone
				"198.51.100.0/24",               // the client's segment
				"10.244.0.0/16",                 // pods only
				"192.0.2.0/24",                  // nodes only
				"203.0.113.0/24",                // no vantage point
			)}
		}
	}
	if g.chance(0.25) {
		// Either half of the external range: the upper half is outside
		// the agent's --external-ip-cidrs.
		spec.ExternalIPs = []string{g.externalIP(g.chance(0.7)).String()}
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

// clusterIP draws an unused address of serviceBand.
func (g *generator) clusterIP() netip.Addr {
	for {
		a := serviceBand.Addr().As4()
		n := g.r.Uint32N(1<<(32-serviceBand.Bits())-2) + 1
		a[2] |= byte(n >> 8)
		a[3] = byte(n)
		ip := netip.AddrFrom4(a)
		if !g.ips[ip] {
			g.ips[ip] = true
			return ip
		}
	}
}

// externalIP draws an unused address of the external range, in the half
// the agent allows or the other.
func (g *generator) externalIP(allowed bool) netip.Addr {
	for {
		n := 1 + g.r.IntN(126)
		if !allowed {
			n += 128
		}
		ip := netns.ExternalIP(n)
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
