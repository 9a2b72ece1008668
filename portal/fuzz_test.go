package portal

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzBuild feeds the builder Services, EndpointSlices and Nodes decoded
// (as the apiserver sends them, JSON) from fuzzed bytes. Build must not
// panic and must return valid portals; a Tracker holding the Service and a
// copy of it under another name must give every address and port to one
// Service only.
func FuzzBuild(f *testing.F) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{v1.LabelTopologyZone: "z1"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: "192.168.1.10"}, {Type: v1.NodeInternalIP, Address: "2001:db8::10"},
			{Type: v1.NodeExternalIP, Address: "198.51.100.10"}}}}
	for _, c := range buildCases() {
		f.Add(mustJSON(f, c.svc), mustJSON(f, c.slices), mustJSON(f, node))
	}
	f.Fuzz(func(t *testing.T, svcJSON, slicesJSON, nodeJSON []byte) {
		var svc v1.Service
		if json.Unmarshal(svcJSON, &svc) != nil {
			return
		}
		var eslices []*discovery.EndpointSlice
		_ = json.Unmarshal(slicesJSON, &eslices)
		// Informers never hand out nil objects.
		eslices = slices.DeleteFunc(eslices, func(es *discovery.EndpointSlice) bool { return es == nil })
		var n v1.Node
		_ = json.Unmarshal(nodeJSON, &n)
		cfg := buildTestConfig()
		cfg.NodePortCIDRs = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("2001:db8::/64")}

		s, _ := cfg.Build(&svc, eslices)
		if s != nil {
			if want := (ServiceKey{svc.Namespace, svc.Name}); s.Key != want {
				t.Errorf("built %v for Service %v", s.Key, want)
			}
			checkService(t, s)
		}

		tr := NewTracker(cfg, nil, nil)
		tr.SetNode(&n)
		twin := svc.DeepCopy()
		twin.Name += "-twin"
		for _, o := range []*v1.Service{&svc, twin} {
			tr.SetService(o)
			for i, es := range eslices {
				es = es.DeepCopy()
				es.Namespace, es.Name = o.Namespace, fmt.Sprintf("%s-%d", o.Name, i)
				if es.Labels == nil {
					es.Labels = map[string]string{}
				}
				es.Labels[LabelServiceName] = o.Name
				tr.SetSlice(es)
			}
		}
		snap, _ := tr.Snapshot()
		checkAddrs(t, "node port addresses", snap.Node.NodePortAddrs, 0)
		type claimKey struct {
			addr  netip.Addr
			proto Protocol
			port  uint16
		}
		owner := map[claimKey]ServiceKey{}
		claim := func(c claimKey, k ServiceKey) {
			if o, ok := owner[c]; ok && o != k {
				t.Errorf("%v and %v both hold %v", o, k, c)
			}
			owner[c] = k
		}
		for k, s := range snap.Services {
			if s == nil || s.Key != k {
				t.Errorf("snapshot entry %v holds %+v", k, s)
				continue
			}
			checkService(t, s)
			for _, p := range s.Portals {
				for _, ips := range [][]netip.Addr{p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs} {
					for _, ip := range ips {
						claim(claimKey{ip, p.Key.Protocol, p.Port}, k)
					}
				}
				if p.NodePort != 0 {
					claim(claimKey{netip.Addr{}, p.Key.Protocol, p.NodePort}, k)
				}
			}
		}
	})
}

func mustJSON(f *testing.F, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// checkService checks what backends rely on: portals sorted by key, one per
// key, each with valid addresses of its family, sorted and unique, ports in
// range, and no two portals of the Service on one address and port.
func checkService(t *testing.T, s *Service) {
	t.Helper()
	type way struct {
		addr  netip.Addr
		proto Protocol
		port  uint16
	}
	ways := map[way]PortKey{}
	for i, p := range s.Portals {
		if p == nil {
			t.Errorf("%v: portal %d is nil", s.Key, i)
			continue
		}
		if i > 0 && s.Portals[i-1] != nil && s.Portals[i-1].Key.String() >= p.Key.String() {
			t.Errorf("%v: portals not sorted by key or not unique: %v then %v", s.Key, s.Portals[i-1].Key, p.Key)
		}
		k := p.Key
		if k.Service != s.Key || (k.Family != IPv4 && k.Family != IPv6) || (k.Protocol != TCP && k.Protocol != UDP && k.Protocol != SCTP) {
			t.Errorf("%v: bad portal key %+v", s.Key, k)
		}
		if p.Port == 0 {
			t.Errorf("%v: port 0", k)
		}
		checkAddrs(t, k.String()+" cluster IPs", p.ClusterIPs, k.Family)
		checkAddrs(t, k.String()+" external IPs", p.ExternalIPs, k.Family)
		checkAddrs(t, k.String()+" load-balancer IPs", p.LoadBalancerIPs, k.Family)
		for _, a := range slices.Concat(p.ExternalIPs, p.LoadBalancerIPs) {
			if !servable(a) {
				t.Errorf("%v: loopback, link-local or multicast external address %v", k, a)
			}
		}
		for _, e := range slices.Concat(p.ClusterEndpoints, p.LocalEndpoints) {
			if !servable(e.Addr()) {
				t.Errorf("%v: loopback, link-local or multicast endpoint %v", k, e)
			}
		}
		if len(p.ClusterIPs) > 1 {
			t.Errorf("%v: more than one cluster IP: %v", k, p.ClusterIPs)
		}
		for j, r := range p.SourceRanges {
			if !r.IsValid() || r != r.Masked() || FamilyOf(r.Addr()) != k.Family || r.Addr().Is4In6() {
				t.Errorf("%v: bad source range %v", k, r)
			}
			if j > 0 && !prefixLess(p.SourceRanges[j-1], r) {
				t.Errorf("%v: source ranges not sorted or not unique: %v", k, p.SourceRanges)
			}
		}
		checkEndpoints(t, k.String()+" cluster endpoints", p.ClusterEndpoints, k.Family)
		checkEndpoints(t, k.String()+" local endpoints", p.LocalEndpoints, k.Family)
		if p.LocalReady < 0 || p.LocalReady > len(p.LocalEndpoints) {
			t.Errorf("%v: %d local ready of %d local endpoints", k, p.LocalReady, len(p.LocalEndpoints))
		}
		if p.HealthCheckNodePort != 0 && !p.ExternalLocal {
			t.Errorf("%v: health-check node port without externalTrafficPolicy Local", k)
		}
		if p.Scheduler != "" && !slices.Contains(ipvsSchedulers, p.Scheduler) {
			t.Errorf("%v: unknown scheduler %q", k, p.Scheduler)
		}
		for _, ips := range [][]netip.Addr{p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs} {
			for _, ip := range ips {
				w := way{ip, k.Protocol, p.Port}
				if o, ok := ways[w]; ok {
					t.Errorf("%v and %v both on %v port %d/%v", o, k, ip, p.Port, k.Protocol)
				}
				ways[w] = k
			}
		}
		if p.NodePort != 0 {
			w := way{netip.Addr{}, k.Protocol, p.NodePort}
			if o, ok := ways[w]; ok && o.Family == k.Family && o != k {
				t.Errorf("%v and %v both on node port %d", o, k, p.NodePort)
			}
			ways[w] = k
		}
	}
}

func prefixLess(a, b netip.Prefix) bool {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c < 0
	}
	return a.Bits() < b.Bits()
}

// checkAddrs: valid, not unspecified, of family f (any when 0), unmapped,
// without zone, sorted and unique.
func checkAddrs(t *testing.T, what string, as []netip.Addr, f Family) {
	t.Helper()
	for i, a := range as {
		if !a.IsValid() || a.IsUnspecified() || a.Zone() != "" || a.Is4In6() || (f != 0 && FamilyOf(a) != f) {
			t.Errorf("%s: bad address %v", what, a)
		}
		if i > 0 && as[i-1].Compare(a) >= 0 {
			t.Errorf("%s: not sorted or not unique: %v", what, as)
		}
	}
}

func checkEndpoints(t *testing.T, what string, eps []netip.AddrPort, f Family) {
	t.Helper()
	for i, e := range eps {
		a := e.Addr()
		if !a.IsValid() || a.IsUnspecified() || a.Zone() != "" || a.Is4In6() || FamilyOf(a) != f || e.Port() == 0 {
			t.Errorf("%s: bad endpoint %v", what, e)
		}
		if i > 0 && eps[i-1].Compare(e) >= 0 {
			t.Errorf("%s: not sorted or not unique: %v", what, eps)
		}
	}
}
