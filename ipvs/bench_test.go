package ipvs

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// BenchmarkPlan10k measures the in-memory part of every Sync: the whole
// plan for 10k Services x 10 endpoints (the kernel part is the diff's
// netlink messages and at most one iptables-restore per table).
func BenchmarkPlan10k(b *testing.B) {
	svcs, in := bench10k()
	b.ReportAllocs()
	for b.Loop() {
		pl := buildPlan(in, svcs)
		if len(pl.Servers) != 10000 {
			b.Fatal(len(pl.Servers))
		}
	}
}

// BenchmarkIncremental10k measures the in-memory part of an incremental
// Sync for one changed Service among 10k: replacing its part and taking
// the subsets the diff looks at.
func BenchmarkIncremental10k(b *testing.B) {
	svcs, in := bench10k()
	pl := buildPlan(in, svcs)
	k := portal.ServiceKey{Namespace: "bench", Name: "s42"}
	b.ReportAllocs()
	for b.Loop() {
		dirty := pl.expandDirty([]portal.ServiceKey{k})
		t := newTouched()
		t.addPart(pl.Parts[k])
		_ = pl.subset(t)
		pl.replace(in, dirty, svcs)
		t.addPart(pl.Parts[k])
		_ = pl.subset(t)
	}
}

func bench10k() (map[portal.ServiceKey]*portal.Service, planInput) {
	svcs := map[portal.ServiceKey]*portal.Service{}
	for i := range 10000 {
		k := portal.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("s%d", i)}
		p := &portal.Portal{Key: portal.PortKey{Service: k, Port: "http", Protocol: portal.TCP, Family: portal.IPv4}, Port: 80,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})}}
		for e := range 10 {
			p.ClusterEndpoints = append(p.ClusterEndpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), uint16(8000+e)))
		}
		svcs[k] = &portal.Service{Key: k, Portals: []*portal.Portal{p}}
	}
	in := planInput{Cfg: dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, Sched: "rr"}
	return svcs, in
}
