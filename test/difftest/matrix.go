package difftest

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
)

// The service matrix: a fixed set of Services, one per behaviour a proxy
// owes (rows), each reached every way in (columns: cluster IP, each node's
// NodePort, an externalIP, a load-balancer IP) over TCP and UDP, in one
// address family at a time. Every probe has the outcome kube-proxy's
// semantics demand written out by the oracle (matrix_oracle.go); the test
// (matrix_test.go) holds both twins to it. docs/service-matrix.md prints
// the result.

// Addresses of the plan by IP family, as the matrix needs them.

func nodeIPOf(f v1.IPFamily, n int) netip.Addr {
	if f == v1.IPv6Protocol {
		return nodeIP6(n)
	}
	return nodeIP(n)
}

// bridgeIPOf is node n's address toward its pods: the source a packet
// masqueraded toward a pod of the node carries.
func bridgeIPOf(f v1.IPFamily, n int) netip.Addr {
	if f == v1.IPv6Protocol {
		return bridgeIP6(n)
	}
	return bridgeIP(n)
}

func clientIPOf(f v1.IPFamily) netip.Addr {
	if f == v1.IPv6Protocol {
		return clientIP6()
	}
	return netns.ClientIP()
}

func unallocatedIPOf(f v1.IPFamily) netip.Addr {
	if f == v1.IPv6Protocol {
		return unallocatedIP6
	}
	return unallocatedIP
}

// matrixClusterIP is the i-th matrix Service's cluster IP: in the lower
// half of the service CIDR, above the barrier's addresses and the
// unallocated one.
func matrixClusterIP(f v1.IPFamily, i int) netip.Addr {
	if f == v1.IPv6Protocol {
		return netip.MustParseAddr(fmt.Sprintf("fd00:96::1%02x", i))
	}
	return netip.AddrFrom4([4]byte{10, 96, 1, byte(1 + i)})
}

// matrixExternalIP and matrixIngressIP are the i-th Service's externalIP
// and load-balancer IP: inside the agent's --external-ip-cidrs, routed to
// node 1 by the router.
func matrixExternalIP(f v1.IPFamily, i int) netip.Addr {
	if f == v1.IPv6Protocol {
		return externalIP6(0x40+i, true)
	}
	return netns.ExternalIP(40 + i)
}

func matrixIngressIP(f v1.IPFamily, i int) netip.Addr {
	if f == v1.IPv6Protocol {
		return externalIP6(0x70+i, true)
	}
	return netns.ExternalIP(70 + i)
}

// clientRange and otherRange are loadBalancerSourceRanges that let the
// outside client in, and that leave it (and every pod and node) out.
func clientRange(f v1.IPFamily) string {
	a := clientIPOf(f)
	return netip.PrefixFrom(a, a.BitLen()).String()
}

func otherRange(f v1.IPFamily) string {
	if f == v1.IPv6Protocol {
		return "2001:db8:51::8000/113"
	}
	return "198.51.100.128/25"
}

// The matrix Services' ports: one TCP and one UDP, each to a port every
// echo server serves.
const (
	matrixTCPPort   = 80
	matrixTCPTarget = 8080
	matrixUDPPort   = 53
	matrixUDPTarget = 5353
)

// behaviour is one row of the matrix: a Service set up to show it.
type behaviour struct {
	Name string // as printed in the table
	Key  string // the Service's name
	// Ways lists the columns that apply (nil: every way into a Service).
	Ways []wayKind
	// NoService: the row probes an address no Service has.
	NoService bool
	// UndefinedPort: the row probes a port its Service does not define.
	UndefinedPort bool
	// SliceLabels are set on the Service's EndpointSlices once written.
	SliceLabels map[string]string
	// setup changes the base Service: a LoadBalancer with externalTrafficPolicy
	// and internalTrafficPolicy Cluster, an externalIP and an ingress IP,
	// and no endpoints.
	setup func(s *ServiceCase, f v1.IPFamily)
}

// Endpoint conditions the rows use.
func ready(p podRef) Endpoint {
	return Endpoint{Pod: p, Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
}

func notReady(p podRef) Endpoint {
	return Endpoint{Pod: p, Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
}

func terminating(p podRef, serving bool) Endpoint {
	return Endpoint{Pod: p, Ready: ptr.To(false), Serving: ptr.To(serving), Terminating: ptr.To(true)}
}

// Pods the rows list: pod 1 of each node is also a vantage point (so a pod
// reaching itself is probed), pod 2 only an endpoint.
var (
	pod11 = podRef{1, 1}
	pod12 = podRef{1, 2}
	pod22 = podRef{2, 2}
)

// behaviours are the matrix's rows, in the table's order.
func behaviours() []behaviour {
	return []behaviour{
		{Name: "balancing over both nodes", Key: "balance", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Endpoints = []Endpoint{ready(pod11), ready(pod22)}
		}},
		{Name: "port the Service does not define", Key: "undefined-port", Ways: []wayKind{wayClusterIP}, UndefinedPort: true, setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Endpoints = []Endpoint{ready(pod12)}
		}},
		{Name: "unallocated cluster IP", Key: "unallocated", Ways: []wayKind{wayClusterIP}, NoService: true},
		{Name: "no endpoints", Key: "no-endpoints", setup: func(*ServiceCase, v1.IPFamily) {}},
		{Name: "externalTrafficPolicy Local", Key: "etp-local", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Service.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Endpoints = []Endpoint{ready(pod11), ready(pod12)}
		}},
		{Name: "internalTrafficPolicy Local", Key: "itp-local", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Service.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
			s.Endpoints = []Endpoint{ready(pod12)}
		}},
		{Name: "sessionAffinity ClientIP", Key: "affinity", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Service.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Service.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(10800))}}
			s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
		}},
		{Name: "loadBalancerSourceRanges, client allowed", Key: "ranges-allowed", setup: func(s *ServiceCase, f v1.IPFamily) {
			s.Service.Spec.LoadBalancerSourceRanges = []string{clientRange(f)}
			s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
		}},
		{Name: "loadBalancerSourceRanges, client denied", Key: "ranges-denied", setup: func(s *ServiceCase, f v1.IPFamily) {
			s.Service.Spec.LoadBalancerSourceRanges = []string{otherRange(f)}
			s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
		}},
		{Name: "only terminating endpoints (serving ones used)", Key: "terminating", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Endpoints = []Endpoint{terminating(pod12, true), terminating(pod22, false)}
		}},
		{Name: "not-ready endpoint left out", Key: "not-ready", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Endpoints = []Endpoint{ready(pod12), notReady(pod22)}
		}},
		{Name: "trafficDistribution PreferSameZone", Key: "same-zone", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Service.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameZone)
			s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
		}},
		{Name: "trafficDistribution PreferSameNode", Key: "same-node", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Service.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameNode)
			s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
		}},
		{Name: "label service.kubernetes.io/headless on the Service (served all the same)", Key: "headless-service", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Service.Labels = map[string]string{labelHeadless: ""}
			s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
		}},
		{Name: "label service.kubernetes.io/headless on its EndpointSlices", Key: "headless-slices",
			SliceLabels: map[string]string{labelHeadless: ""}, setup: func(s *ServiceCase, _ v1.IPFamily) {
				s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
			}},
		{Name: "label service.kubernetes.io/service-proxy-name", Key: "other-proxy", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Service.Labels = map[string]string{labelServiceProxyName: "another-proxy"}
			s.Endpoints = []Endpoint{ready(pod12), ready(pod22)}
		}},
		{Name: "source seen under Cluster policy (masqueraded)", Key: "masquerade", setup: func(s *ServiceCase, _ v1.IPFamily) {
			s.Endpoints = []Endpoint{ready(pod22)}
		}},
	}
}

// matrixCase builds the matrix's Services in family f: one per behaviour
// that has one, each a LoadBalancer with a TCP and a UDP port, its
// NodePorts, an externalIP and an ingress IP, then set up as its row says.
func matrixCase(f v1.IPFamily) *Case {
	c := &Case{}
	for i, b := range behaviours() {
		if b.NoService {
			continue
		}
		ip := matrixClusterIP(f, i).String()
		svc := &v1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: matrixServiceName(b.Key, f), Namespace: namespace},
			Spec: v1.ServiceSpec{
				Type:                  v1.ServiceTypeLoadBalancer,
				ClusterIP:             ip,
				ClusterIPs:            []string{ip},
				IPFamilies:            []v1.IPFamily{f},
				IPFamilyPolicy:        ptr.To(v1.IPFamilyPolicySingleStack),
				ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyCluster,
				InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
				ExternalIPs:           []string{matrixExternalIP(f, i).String()},
				Ports: []v1.ServicePort{
					{Name: "tcp", Protocol: v1.ProtocolTCP, Port: matrixTCPPort, TargetPort: intstr.FromInt32(matrixTCPTarget), NodePort: int32(31000 + 2*i)},
					{Name: "udp", Protocol: v1.ProtocolUDP, Port: matrixUDPPort, TargetPort: intstr.FromInt32(matrixUDPTarget), NodePort: int32(31001 + 2*i)},
				},
			},
		}
		s := &ServiceCase{Service: svc, Ingress: []string{matrixIngressIP(f, i).String()}}
		b.setup(s, f)
		if svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal {
			svc.Spec.HealthCheckNodePort = int32(32000 + i)
		}
		c.Services = append(c.Services, s)
	}
	return c
}

// matrixServiceName is the name of row key's Service in family f.
func matrixServiceName(key string, f v1.IPFamily) string {
	if f == v1.IPv6Protocol {
		return "m6-" + key
	}
	return "m4-" + key
}

// seen is s as the proxies see it: without the endpoints of EndpointSlices
// they leave alone (the headless label).
func (b behaviour) seen(s *ServiceCase) *ServiceCase {
	if _, headless := b.SliceLabels[labelHeadless]; !headless || s == nil {
		return s
	}
	out := *s
	out.Endpoints = nil
	return &out
}

// labelSlices sets the SliceLabels of c's rows on their Services'
// EndpointSlices in tw.
func (tw *Twin) labelSlices(ctx context.Context, c *Case, f v1.IPFamily) error {
	for _, b := range behaviours() {
		if len(b.SliceLabels) == 0 {
			continue
		}
		s := c.service(matrixServiceName(b.Key, f))
		for _, sl := range s.slices() {
			cur, err := tw.Client.DiscoveryV1().EndpointSlices(namespace).Get(ctx, sl.Name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("%s: EndpointSlice %s: %w", tw.Name, sl.Name, err)
			}
			for k, v := range b.SliceLabels {
				cur.Labels[k] = v
			}
			if _, err := tw.Client.DiscoveryV1().EndpointSlices(namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("%s: label EndpointSlice %s: %w", tw.Name, sl.Name, err)
			}
		}
	}
	return nil
}
