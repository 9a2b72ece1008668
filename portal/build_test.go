package portal

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func svc(mut func(s *v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	if mut != nil {
		mut(s)
	}
	return s
}

type ep struct {
	ip                          string
	node                        string
	ready, serving, terminating *bool
	zones                       []string
	nodes                       []string // hints.forNodes
}

func slice(name string, at discovery.AddressType, port int32, eps ...ep) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{LabelServiceName: "web"}},
		AddressType: at,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, e := range eps {
		d := discovery.Endpoint{Addresses: []string{e.ip}, Conditions: discovery.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating}}
		if e.node != "" {
			d.NodeName = ptr.To(e.node)
		}
		if len(e.zones)+len(e.nodes) > 0 {
			d.Hints = &discovery.EndpointHints{}
			for _, z := range e.zones {
				d.Hints.ForZones = append(d.Hints.ForZones, discovery.ForZone{Name: z})
			}
			for _, n := range e.nodes {
				d.Hints.ForNodes = append(d.Hints.ForNodes, discovery.ForNode{Name: n})
			}
		}
		es.Endpoints = append(es.Endpoints, d)
	}
	return es
}

func addrs(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

func buildTestConfig() Config {
	return Config{NodeName: "n1", NodeZone: "z1",
		ServiceCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
}

type buildCase struct {
	name     string
	svc      *v1.Service
	slices   []*discovery.EndpointSlice
	want     func(t *testing.T, s *Service)
	problems []string // reasons expected
}

// buildCases are TestBuild's cases, also the seeds of FuzzBuild.
func buildCases() []buildCase {
	yes, no := ptr.To(true), ptr.To(false)
	cfg := buildTestConfig()
	return []buildCase{
		{
			name:   "cluster IP with ready endpoints; target port from the slice",
			svc:    svc(nil),
			slices: []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"}, ep{ip: "10.244.2.2", ready: no})},
			want: func(t *testing.T, s *Service) {
				p := s.Portals[0]
				if p.Key.Protocol != TCP || p.Port != 80 || !slices.Equal(p.ClusterEndpoints, addrs("10.244.1.2:8080")) {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			// kube-proxy reads an unset serving as true: a terminating
			// endpoint that says nothing more is a fallback when none is ready.
			name:   "an unset serving condition is true",
			svc:    svc(nil),
			slices: []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2", ready: no, terminating: yes})},
			want: func(t *testing.T, s *Service) {
				if p := s.Portals[0]; !slices.Equal(p.ClusterEndpoints, addrs("10.244.1.2:8080")) {
					t.Errorf("endpoints %v; want the terminating one, serving by default", p.ClusterEndpoints)
				}
			},
		},
		{
			// publishNotReadyAddresses is the EndpointSlice controller's:
			// it writes such endpoints ready. A slice that says not ready
			// is believed, as kube-proxy does.
			name:   "publishNotReadyAddresses does not override the slice",
			svc:    svc(func(s *v1.Service) { s.Spec.PublishNotReadyAddresses = true }),
			slices: []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2", ready: no, serving: no}, ep{ip: "10.244.1.3"})},
			want: func(t *testing.T, s *Service) {
				if p := s.Portals[0]; !slices.Equal(p.ClusterEndpoints, addrs("10.244.1.3:8080")) {
					t.Errorf("endpoints %v; want the ready one alone", p.ClusterEndpoints)
				}
			},
		},
		{
			// An address in two slices: a terminating pod's, reused by a new
			// pod before the old one is gone. The entry that is not
			// terminating wins, whichever slice comes first.
			name: "an endpoint listed twice takes the entry that is not terminating",
			svc:  svc(nil),
			slices: []*discovery.EndpointSlice{
				slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2", node: "n1", ready: no, serving: yes, terminating: yes}),
				slice("b", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2", node: "n2"}),
				slice("c", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2", node: "n1", ready: no, serving: yes, terminating: yes}),
			},
			want: func(t *testing.T, s *Service) {
				if p := s.Portals[0]; !slices.Equal(p.ClusterEndpoints, addrs("10.244.1.2:8080")) || len(p.Hairpin) != 0 {
					t.Errorf("endpoints %v, hairpin %v; want the ready entry on n2 alone", p.ClusterEndpoints, p.Hairpin)
				}
			},
		},
		{
			name: "headless and ExternalName are not served",
			svc:  svc(func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, nil }),
			want: func(t *testing.T, s *Service) {
				if s != nil {
					t.Errorf("headless built %+v", s)
				}
			},
		},
		{
			name: "another proxy's Service is not served",
			svc:  svc(func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} }),
			want: func(t *testing.T, s *Service) {
				if s != nil {
					t.Errorf("built %+v", s)
				}
			},
		},
		{
			name: "dual stack gives one portal per family; slices by address type",
			svc: svc(func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
				s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
			}),
			slices: []*discovery.EndpointSlice{
				slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"}),
				slice("b", discovery.AddressTypeIPv6, 8080, ep{ip: "fd00:244::2"}),
			},
			want: func(t *testing.T, s *Service) {
				if len(s.Portals) != 2 || s.Portals[1].Key.Family != IPv6 || !slices.Equal(s.Portals[1].ClusterEndpoints, addrs("[fd00:244::2]:8080")) {
					t.Errorf("got %+v", s.Portals)
				}
			},
		},
		{
			name: "bad values are refused, the rest is kept",
			svc: svc(func(s *v1.Service) {
				s.Spec.ClusterIPs = []string{"10.96.0.10", "nonsense"}
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "x", Port: 0}, v1.ServicePort{Name: "y", Port: 9, Protocol: "ICMP"})
			}),
			slices:   []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.96.5.5"}, ep{ip: "999.1.1.1"}, ep{ip: "10.244.1.2"})},
			problems: []string{ReasonInvalidClusterIP, ReasonInvalidPort, ReasonInvalidPort, ReasonInvalidEndpoint, ReasonInvalidEndpoint},
			want: func(t *testing.T, s *Service) {
				if len(s.Portals) != 1 || !slices.Equal(s.Portals[0].ClusterEndpoints, addrs("10.244.1.2:8080")) {
					t.Errorf("got %+v", s.Portals)
				}
			},
		},
		{
			name:     "cluster IP of the wrong family is refused",
			svc:      svc(func(s *v1.Service) { s.Spec.ClusterIPs = []string{"fd00::1"} }),
			problems: []string{ReasonInvalidClusterIP},
			want: func(t *testing.T, s *Service) {
				if len(s.Portals) != 0 {
					t.Errorf("got %+v", s.Portals)
				}
			},
		},
		{
			name: "externalIPs only inside the allowed CIDRs; LB ingress skips ipMode Proxy",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalIPs = []string{"203.0.113.5", "198.51.100.5"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.9"}, {IP: "203.0.113.10", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)}}
			}),
			problems: []string{ReasonExternalIPRefused},
			want: func(t *testing.T, s *Service) {
				p := s.Portals[0]
				if p.NodePort != 30080 || len(p.ExternalIPs) != 1 || p.ExternalIPs[0].String() != "203.0.113.5" ||
					len(p.LoadBalancerIPs) != 1 || p.LoadBalancerIPs[0].String() != "203.0.113.9" {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			name: "no ready endpoint: serving terminating ones; local ones for the Local policy",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			slices: []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080,
				ep{ip: "10.244.1.2", node: "n1", ready: no, serving: yes, terminating: yes},
				ep{ip: "10.244.2.2", node: "n2", ready: no, serving: yes, terminating: yes},
				ep{ip: "10.244.3.2", node: "n1", ready: no, serving: no, terminating: yes})},
			want: func(t *testing.T, s *Service) {
				p := s.Portals[0]
				if !p.ExternalLocal || !slices.Equal(p.ClusterEndpoints, addrs("10.244.1.2:8080", "10.244.2.2:8080")) ||
					!slices.Equal(p.LocalEndpoints, addrs("10.244.1.2:8080")) || p.LocalReady != 0 {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			name: "topology hints apply when every endpoint has them",
			svc:  svc(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To("PreferClose") }),
			slices: []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080,
				ep{ip: "10.244.1.2", zones: []string{"z1"}}, ep{ip: "10.244.2.2", zones: []string{"z2"}})},
			want: func(t *testing.T, s *Service) {
				if !slices.Equal(s.Portals[0].ClusterEndpoints, addrs("10.244.1.2:8080")) {
					t.Errorf("got %+v", s.Portals[0].ClusterEndpoints)
				}
			},
		},
		{
			name: "topology hints are all or nothing",
			svc:  svc(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To("PreferClose") }),
			slices: []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080,
				ep{ip: "10.244.1.2", zones: []string{"z1"}}, ep{ip: "10.244.2.2"})},
			want: func(t *testing.T, s *Service) {
				if len(s.Portals[0].ClusterEndpoints) != 2 {
					t.Errorf("got %+v", s.Portals[0].ClusterEndpoints)
				}
			},
		},
		{
			name:     "an unknown IPVS scheduler is refused; a known one is kept",
			svc:      svc(func(s *v1.Service) { s.Annotations = map[string]string{AnnotationScheduler: "fastest"} }),
			problems: []string{ReasonInvalidScheduler},
			want: func(t *testing.T, s *Service) {
				if s.Portals[0].Scheduler != "" {
					t.Errorf("got %q", s.Portals[0].Scheduler)
				}
				ok, _ := cfg.Build(svc(func(s *v1.Service) { s.Annotations = map[string]string{AnnotationScheduler: "mh"} }), nil)
				if ok.Portals[0].Scheduler != "mh" {
					t.Errorf("mh: got %q", ok.Portals[0].Scheduler)
				}
			},
		},
		{
			name: "a port listed twice, or on a port or node port already used, is programmed once",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = []v1.ServicePort{
					{Name: "http", Port: 80, NodePort: 30080}, {Name: "http", Port: 81, NodePort: 30081},
					{Name: "alt", Port: 80, NodePort: 30082}, {Name: "dns", Port: 53, NodePort: 30080},
					{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP, NodePort: 30080},
				}
			}),
			problems: []string{ReasonInvalidPort, ReasonInvalidPort, ReasonInvalidPort},
			want: func(t *testing.T, s *Service) {
				var got []string
				for _, p := range s.Portals {
					got = append(got, fmt.Sprintf("%s/%d/%d", p.Key.Port, p.Port, p.NodePort))
				}
				if want := []string{"dns/53/0", "dns/53/30080", "http/80/30080"}; !slices.Equal(got, want) {
					t.Errorf("got %v, want %v", got, want)
				}
			},
		},
		{
			name: "an address that is cluster, external and load-balancer IP is programmed once",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalIPs = []string{"203.0.113.5"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "203.0.113.5"}, {IP: "10.96.0.10"}, {IP: "203.0.113.6"}}
			}),
			problems: []string{ReasonInvalidIngressIP, ReasonInvalidIngressIP},
			want: func(t *testing.T, s *Service) {
				p := s.Portals[0]
				if fmt.Sprint(p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs) != "[10.96.0.10] [203.0.113.5] [203.0.113.6]" {
					t.Errorf("got %v %v %v", p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs)
				}
			},
		},
		{
			name: "loopback, link-local and multicast addresses are refused as external IPs, load-balancer IPs and endpoints",
			svc: svc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.ExternalIPs = []string{"127.0.0.1"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "169.254.169.254"}, {IP: "224.0.0.1"}}
			}),
			slices: []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080,
				ep{ip: "169.254.169.254"}, ep{ip: "127.0.0.1"}, ep{ip: "10.244.1.2"})},
			problems: []string{ReasonExternalIPRefused, ReasonInvalidIngressIP, ReasonInvalidIngressIP, ReasonInvalidEndpoint, ReasonInvalidEndpoint},
			want: func(t *testing.T, s *Service) {
				p := s.Portals[0]
				if len(p.ExternalIPs)+len(p.LoadBalancerIPs) != 0 || !slices.Equal(p.ClusterEndpoints, addrs("10.244.1.2:8080")) {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			name: "session affinity defaults to 10800 s",
			svc:  svc(func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			want: func(t *testing.T, s *Service) {
				if s.Portals[0].Affinity.TimeoutSeconds != 10800 {
					t.Errorf("got %+v", s.Portals[0].Affinity)
				}
			},
		},
	}
}

func TestBuild(t *testing.T) {
	cfg := buildTestConfig()
	for _, c := range buildCases() {
		t.Run(c.name, func(t *testing.T) {
			s, problems := cfg.Build(c.svc, c.slices)
			var reasons []string
			for _, p := range dedupe(problems) {
				reasons = append(reasons, p.Reason)
			}
			slices.Sort(reasons)
			want := slices.Clone(c.problems)
			slices.Sort(want)
			if !slices.Equal(reasons, want) {
				t.Errorf("problems: got %v, want %v (%v)", reasons, want, problems)
			}
			c.want(t, s)
		})
	}
}

func TestTrackerRebuildsOnlyChangedServices(t *testing.T) {
	notified := 0
	tr := NewTracker(Config{NodeName: "n1"}, nil, func() { notified++ })
	a := svc(nil)
	b := svc(func(s *v1.Service) { s.Name = "other"; s.Spec.ClusterIPs = []string{"10.96.0.11"} })
	tr.SetService(a)
	tr.SetService(b)
	snap, _ := tr.Snapshot()
	if len(snap.Dirty) != 2 || len(snap.Services) != 2 {
		t.Fatalf("first snapshot: %+v", snap)
	}
	tr.SetSlice(slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"}))
	snap, _ = tr.Snapshot()
	if len(snap.Dirty) != 1 || snap.Dirty[0].Name != "web" {
		t.Errorf("want only web dirty, got %v", snap.Dirty)
	}
	// An update that changes nothing the dataplane sees is not dirty.
	a2 := a.DeepCopy()
	a2.Annotations = map[string]string{"unrelated": "x"}
	tr.SetService(a2)
	if snap, _ = tr.Snapshot(); len(snap.Dirty) != 0 {
		t.Errorf("no-op update made %v dirty", snap.Dirty)
	}
	tr.DeleteService("ns", "other")
	snap, _ = tr.Snapshot()
	if len(snap.Dirty) != 1 || snap.Services[ServiceKey{"ns", "other"}] != nil {
		t.Errorf("delete: %+v", snap)
	}
	if notified != 5 {
		t.Errorf("notify called %d times, want 5", notified)
	}
}

func TestNodePortAddrs(t *testing.T) {
	n := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: "192.0.2.10"}, {Type: v1.NodeInternalIP, Address: "192.0.2.11"},
		{Type: v1.NodeExternalIP, Address: "203.0.113.1"}, {Type: v1.NodeInternalIP, Address: "fd00::10"},
		{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: "n1"}}}}
	if got := fmt.Sprint(nodePortAddrs(n, nil)); got != "[192.0.2.10 fd00::10]" {
		t.Errorf("primary: got %v", got)
	}
	got := nodePortAddrs(n, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("127.0.0.0/8")})
	if fmt.Sprint(got) != "[192.0.2.10 192.0.2.11]" {
		t.Errorf("cidrs: got %v", got)
	}
}

type recordReporter struct{ got []Problem }

func (r *recordReporter) Report(_ *v1.Service, ps []Problem) { r.got = append(r.got, ps...) }

// Two Services claiming one address and port: the first keeps it, the
// other is refused with an event and gets it when the first lets go.
func TestTrackerConflictingClaims(t *testing.T) {
	rep := &recordReporter{}
	tr := NewTracker(Config{NodeName: "n1", ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, rep, nil)
	a := svc(func(s *v1.Service) {
		s.Name = "a"
		s.CreationTimestamp = metav1.Unix(100, 0)
		s.Spec.ExternalIPs = []string{"203.0.113.5"}
	})
	b := svc(func(s *v1.Service) {
		s.Name = "b"
		s.CreationTimestamp = metav1.Unix(200, 0)
		s.Spec.ClusterIPs = []string{"10.96.0.11"}
		s.Spec.ExternalIPs = []string{"203.0.113.5"}
	})
	tr.SetService(b)
	tr.SetService(a)
	snap, _ := tr.Snapshot()
	ka, kb := ServiceKey{"ns", "a"}, ServiceKey{"ns", "b"}
	if got := snap.Services[ka].Portals[0].ExternalIPs; len(got) != 1 {
		t.Errorf("the older Service must keep 203.0.113.5:80, got %v", got)
	}
	if got := snap.Services[kb].Portals[0].ExternalIPs; len(got) != 0 {
		t.Errorf("the newer Service must lose it, got %v", got)
	}
	if len(rep.got) != 1 || rep.got[0].Reason != ReasonPortConflict || rep.got[0].Service != kb {
		t.Errorf("want one PortConflict on b, got %v", rep.got)
	}
	tr.DeleteService("ns", "a")
	snap, _ = tr.Snapshot()
	if got := snap.Services[kb].Portals[0].ExternalIPs; len(got) != 1 {
		t.Errorf("after a is gone, b must get 203.0.113.5:80, got %v", got)
	}
	if !slices.Contains(snap.Dirty, kb) {
		t.Errorf("b must be dirty, got %v", snap.Dirty)
	}
}

// An address handed from a newer Service to an older one within one sync
// window: the older one is processed first and loses to the holder that is
// letting go; it must be built again in the same snapshot, not left without
// the address until something else changes.
func TestTrackerHandOverWithinOneSnapshot(t *testing.T) {
	tr := NewTracker(Config{NodeName: "n1", ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}, nil, nil)
	a := svc(func(s *v1.Service) {
		s.Name = "a"
		s.CreationTimestamp = metav1.Unix(100, 0)
	})
	b := svc(func(s *v1.Service) {
		s.Name = "b"
		s.CreationTimestamp = metav1.Unix(200, 0)
		s.Spec.ClusterIPs = []string{"10.96.0.11"}
		s.Spec.ExternalIPs = []string{"203.0.113.5"}
	})
	tr.SetService(a)
	tr.SetService(b)
	tr.Snapshot()
	// In one window: the older Service a asks for the address, the newer b
	// gives it up.
	a2, b2 := a.DeepCopy(), b.DeepCopy()
	a2.Spec.ExternalIPs = []string{"203.0.113.5"}
	b2.Spec.ExternalIPs = nil
	tr.SetService(a2)
	tr.SetService(b2)
	snap, _ := tr.Snapshot()
	ka := ServiceKey{"ns", "a"}
	if got := snap.Services[ka].Portals[0].ExternalIPs; len(got) != 1 {
		t.Errorf("the address b let go must reach a in the same snapshot, a has %v", got)
	}
	if !slices.Contains(snap.Dirty, ka) {
		t.Errorf("a must be dirty, got %v", snap.Dirty)
	}
}
