package portal

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

func TestServingEndpoints(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	cfg := buildTestConfig()
	for _, c := range []struct {
		name                  string
		svc                   *v1.Service
		eps                   []ep
		cluster, local, serve []string
	}{{
		name:    "every endpoint ready: the same endpoints",
		svc:     svc(nil),
		eps:     []ep{{ip: "10.244.1.2"}, {ip: "10.244.2.2"}},
		cluster: []string{"10.244.1.2:8080", "10.244.2.2:8080"},
		serve:   []string{"10.244.1.2:8080", "10.244.2.2:8080"},
	}, {
		name: "a terminating endpoint that serves beside a ready one",
		svc:  svc(nil),
		eps: []ep{{ip: "10.244.1.2"}, {ip: "10.244.1.3", ready: no, serving: yes, terminating: yes},
			{ip: "10.244.1.4", ready: no, serving: no, terminating: yes}, {ip: "10.244.1.5", ready: no, serving: no}},
		cluster: []string{"10.244.1.2:8080"},
		serve:   []string{"10.244.1.2:8080", "10.244.1.3:8080"},
	}, {
		name:    "topology hints narrow the cluster endpoints only",
		svc:     svc(func(s *v1.Service) { s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferClose) }),
		eps:     []ep{{ip: "10.244.1.2", zones: []string{"z1"}}, {ip: "10.244.2.2", zones: []string{"z2"}}},
		cluster: []string{"10.244.1.2:8080"},
		serve:   []string{"10.244.1.2:8080", "10.244.2.2:8080"},
	}, {
		name: "internalTrafficPolicy Local: the other node's endpoints serve too",
		svc: svc(func(s *v1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
		}),
		eps:     []ep{{ip: "10.244.1.2", node: "n1"}, {ip: "10.244.2.2", node: "n2"}},
		cluster: []string{"10.244.1.2:8080", "10.244.2.2:8080"},
		local:   []string{"10.244.1.2:8080"},
		serve:   []string{"10.244.1.2:8080", "10.244.2.2:8080"},
	}, {
		name:    "none serves",
		svc:     svc(nil),
		eps:     []ep{{ip: "10.244.1.2", ready: no, serving: no, terminating: yes}},
		cluster: nil,
		serve:   nil,
	}} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := cfg.Build(c.svc, []*discovery.EndpointSlice{slice("a", discovery.AddressTypeIPv4, 8080, c.eps...)})
			p := s.Portals[0]
			if !slices.Equal(p.ClusterEndpoints, addrs(c.cluster...)) || !slices.Equal(p.LocalEndpoints, addrs(c.local...)) ||
				!slices.Equal(p.Serving, addrs(c.serve...)) {
				t.Errorf("cluster %v, local %v, serving %v; want %v, %v, %v", p.ClusterEndpoints, p.LocalEndpoints, p.Serving, c.cluster, c.local, c.serve)
			}
			// The same endpoints share one array, so that a Portal costs
			// no more memory than without Serving in the common case.
			if len(p.Serving) > 0 && slices.Equal(p.Serving, p.ClusterEndpoints) && &p.Serving[0] != &p.ClusterEndpoints[0] {
				t.Errorf("Serving is a copy of ClusterEndpoints, not the same array")
			}
		})
	}
}

// A change of the serving endpoints alone (a terminating endpoint that
// stops serving while another is ready) programs nothing new, but the
// conntrack cleanup must see it: the Service is rebuilt and listed dirty.
func TestTrackerServingChangeIsDirty(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	tr := NewTracker(Config{NodeName: "n1"}, nil, func() {})
	tr.SetService(svc(nil))
	tr.SetSlice(slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"},
		ep{ip: "10.244.1.3", ready: no, serving: yes, terminating: yes}))
	snap, _ := tr.Snapshot()
	key := ServiceKey{"ns", "web"}
	before := snap.Services[key]
	tr.SetSlice(slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"},
		ep{ip: "10.244.1.3", ready: no, serving: no, terminating: yes}))
	snap, _ = tr.Snapshot()
	after := snap.Services[key]
	if !slices.Equal(snap.Dirty, []ServiceKey{key}) || after == before {
		t.Fatalf("dirty %v, rebuilt %v; want web dirty and rebuilt", snap.Dirty, after != before)
	}
	if !before.Equal(after) || before.Same(after) {
		t.Errorf("Equal %v, Same %v; want Equal (no rule changes) and not Same", before.Equal(after), before.Same(after))
	}
	if !slices.Equal(after.Portals[0].Serving, addrs("10.244.1.2:8080")) {
		t.Errorf("serving %v, want the ready endpoint alone", after.Portals[0].Serving)
	}
	// Nothing changes: nothing is dirty.
	tr.SetSlice(slice("a", discovery.AddressTypeIPv4, 8080, ep{ip: "10.244.1.2"},
		ep{ip: "10.244.1.3", ready: no, serving: no, terminating: yes}))
	if snap, _ = tr.Snapshot(); len(snap.Dirty) != 0 {
		t.Errorf("an unchanged slice made %v dirty", snap.Dirty)
	}
}
