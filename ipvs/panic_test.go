package ipvs

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// A Service whose planning panics halfway (a nil portal after a good one,
// standing for any value the planner chokes on) is left out entirely, the
// address it had taken included, and reported; the plan of every other
// Service is the one built without it, fully or incrementally.
func TestPlanConfinesAPanicToItsService(t *testing.T) {
	in := planInput{Cfg: dataplane.Config{}, Sched: "rr", NodeAddrs: addrs("192.168.1.10")}
	bad := portal.ServiceKey{Namespace: "aa", Name: "bad"} // planned first
	withBad := func() map[portal.ServiceKey]*portal.Service {
		m := representative()
		m[bad] = &portal.Service{Key: bad, Portals: []*portal.Portal{{
			Key: portal.PortKey{Service: bad, Protocol: portal.TCP, Family: portal.IPv4}, Port: 80,
			ClusterIPs: addrs("10.96.7.7"), ExternalIPs: addrs("198.51.100.7"), NodePort: 30007,
			ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.7.7:80")},
			LocalEndpoints:   []netip.AddrPort{netip.MustParseAddrPort("10.244.7.7:80")},
		}, nil}}
		return m
	}
	want := buildPlan(in, representative()).render(in.Cfg, false)

	full := buildPlan(in, withBad())
	if got := full.render(in.Cfg, false); got != want {
		t.Errorf("full plan with the panicking Service differs from the plan without it:\n--- want\n%s\n--- got\n%s", want, got)
	}
	if len(full.Panics) != 1 || full.Panics[0].Service != bad || !strings.Contains(full.Panics[0].Err.Where, "planportal.go:") {
		t.Errorf("want the panic of %s recorded, got %+v", bad, full.Panics)
	}

	inc := buildPlan(in, representative())
	inc.replace(in, inc.expandDirty([]portal.ServiceKey{bad}), withBad())
	if got := inc.render(in.Cfg, false); got != want {
		t.Errorf("incremental plan with the panicking Service differs from the plan without it:\n--- want\n%s\n--- got\n%s", want, got)
	}
	if len(inc.Panics) != 1 || inc.Panics[0].Service != bad {
		t.Errorf("want the panic of %s recorded, got %+v", bad, inc.Panics)
	}
	if _, ok := inc.Parts[bad]; ok {
		t.Errorf("the panicking Service must have no part left")
	}
}
