package dataplane

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/portal"
)

// withServing returns udpService(name, UDP, targets...) whose port's
// serving endpoints (on port 5353) are serving.
func withServing(name string, targets []string, serving ...string) *portal.Service {
	svc := udpService(name, portal.UDP, targets...)
	for _, ep := range serving {
		svc.Portals[0].Serving = append(svc.Portals[0].Serving, netip.AddrPortFrom(netip.MustParseAddr(ep), 5353))
	}
	return svc
}

// A flow stays on an endpoint for as long as it serves the port, whatever
// the DNAT targets of new flows are (kube-proxy's rule); it is cut when
// its endpoint stops serving, and, beyond kube-proxy, through the NodePort
// of a port no endpoint serves and through a deleted Service.
func TestConntrackServingEndpointsKeepFlows(t *testing.T) {
	const a, b, c = "10.244.1.10", "10.244.2.10", "10.244.3.10"
	to := func(dst string, port uint16, ep string) flowCaseFlow { return flowCaseFlow{dst, port, ep} }
	for _, tc := range []struct {
		name         string
		before, cur  *portal.Service
		nothingToDo  bool
		stale, valid []flowCaseFlow
	}{{
		name:        "an endpoint becomes terminating and serving beside a ready one",
		before:      withServing("dns", []string{a, b}, a, b),
		cur:         withServing("dns", []string{b}, a, b),
		nothingToDo: true,
	}, {
		name:   "the terminating endpoint stops serving",
		before: withServing("dns", []string{b}, a, b),
		cur:    withServing("dns", []string{b}, b),
		stale:  []flowCaseFlow{to(vip, 53, a), to(nodeAddr, 30053, a), to(extVIP, 53, a), to(vip, 53, "")},
		valid:  []flowCaseFlow{to(vip, 53, b), to(nodeAddr, 30053, b)},
	}, {
		name:   "another endpoint goes while a serving one is no target",
		before: withServing("dns", []string{a, b}, a, b, c),
		cur:    withServing("dns", []string{b}, a, b),
		stale:  []flowCaseFlow{to(vip, 53, c), to(nodeAddr, 30053, c)},
		valid:  []flowCaseFlow{to(vip, 53, a), to(nodeAddr, 30053, a), to(vip, 53, b)},
	}, {
		name: "a traffic policy flips: the local endpoint is no target any more",
		before: func() *portal.Service {
			s := withServing("dns", []string{b}, a, b)
			s.Portals[0].InternalLocal = true
			s.Portals[0].LocalEndpoints = []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr(a), 5353)}
			return s
		}(),
		cur:         withServing("dns", []string{b}, a, b),
		nothingToDo: true,
	}, {
		name:   "serving endpoints, none a target from this node",
		before: withServing("dns", []string{a, c}, a, c),
		cur:    withServing("dns", nil, a),
		stale:  []flowCaseFlow{to(vip, 53, c)},
		// Un-NATed flows are rejected ones: no target to move them to.
		valid: []flowCaseFlow{to(vip, 53, a), to(nodeAddr, 30053, a), to(vip, 53, ""), to(nodeAddr, 30053, "")},
	}, {
		name:   "no endpoint serves: the NodePort's flows go too",
		before: withServing("dns", []string{b}, a, b),
		cur:    withServing("dns", nil),
		stale:  []flowCaseFlow{to(vip, 53, a), to(nodeAddr, 30053, a), to(nodeAddr, 30053, b), to(extVIP, 53, b)},
		valid:  []flowCaseFlow{to(vip, 53, "")},
	}, {
		name:   "the Service is deleted",
		before: withServing("dns", []string{b}, a, b),
		cur:    nil,
		stale:  []flowCaseFlow{to(vip, 53, a), to(nodeAddr, 30053, a), to(vip, 53, b), to(extVIP, 53, b)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			snap := ctSnap()
			if tc.cur != nil {
				snap = ctSnap(tc.cur)
			}
			f, _ := planConntrack(map[portal.ServiceKey]*portal.Service{tc.before.Key: tc.before}, snap)
			if tc.nothingToDo != f.empty() {
				t.Errorf("nothing to do: %v, want %v (%+v)", f.empty(), tc.nothingToDo, f)
			}
			var cases []flowCase
			for _, fl := range tc.stale {
				cases = append(cases, flowCase{fl.String(), fl.flow(), true})
			}
			for _, fl := range tc.valid {
				cases = append(cases, flowCase{fl.String(), fl.flow(), false})
			}
			checkFlows(t, f, cases)
		})
	}
}

// flowCaseFlow is a UDP flow to dst:port DNATed to ep:5353 (ep "": not
// DNATed).
type flowCaseFlow struct {
	dst  string
	port uint16
	ep   string
}

func (f flowCaseFlow) flow() *netlink.ConntrackFlow {
	if f.ep == "" {
		return notNATed(udp, f.dst, f.port)
	}
	return flow(udp, f.dst, f.port, f.ep, 5353)
}

func (f flowCaseFlow) String() string {
	to := netip.AddrPortFrom(netip.MustParseAddr(f.dst), f.port).String()
	if f.ep == "" {
		return to + " not DNATed"
	}
	return to + " DNATed to " + f.ep
}
