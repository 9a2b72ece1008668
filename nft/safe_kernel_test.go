package nft

import (
	"net/netip"
	"testing"

	"github.com/onehop/onehop/portal"
)

// A Service whose rendering panics is taken out of the kernel and reported,
// and every other Service keeps working, on partial and full syncs alike.
func TestRenderPanicLeavesOtherServicesServed(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 0)
	})
	badIP := netip.MustParseAddr("10.96.0.20")
	ok := service("bad", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{badIP}
		p.ClusterEndpoints = eps(8080, 1)
	})
	tp.sync(t, snapshot(web, ok), true)
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.20:80", 1); seen["pod1"] != 1 {
		t.Fatalf("before: want pod1 behind 10.96.0.20, got %v", seen)
	}
	bad := panicking("bad", badIP)
	for _, full := range []bool{false, true} {
		snap := snapshot(web, bad)
		snap.Dirty = []portal.ServiceKey{bad.Key}
		st := tp.sync(t, snap, full)
		if len(st.Panics) != 1 || st.Panics[0].Service != bad.Key {
			t.Errorf("full=%v: want the panic of %s in the stats, got %+v", full, bad.Key, st.Panics)
		}
		for _, network := range []string{"tcp", "udp"} {
			if seen, _ := ask(t, tp.pods[1], network, "10.96.0.10:80", 3); seen["pod0"] != 3 {
				t.Errorf("full=%v %s: the other Service must still be served, got %v", full, network, seen)
			}
		}
		// Its cluster IP is in the service CIDR and no longer allocated: dropped.
		mustDrop(t, tp.pods[0], "tcp", "10.96.0.20:80")
	}
}
