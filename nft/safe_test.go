package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// panicking is Service name with a good portal and then a nil one, which
// render cannot handle: it stands for any value that makes rendering panic.
func panicking(name string, ip netip.Addr) *portal.Service {
	s := service(name, func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{ip}
		p.ClusterEndpoints = eps(8080, 0)
	})
	s.Portals = append(s.Portals, nil)
	return s
}

// serviceSafely leaves a Service whose rendering panics out of the
// transaction, as if deleted, and reports it; the others are diffed as
// usual. (The diff is pure: no netlink message is sent before commit.)
func TestServiceSafelyConfinesARenderPanic(t *testing.T) {
	b := New(dataplane.Config{})
	good := service("good", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.10")}
		p.ClusterEndpoints = eps(8080, 0)
	})
	bad := panicking("bad", netip.MustParseAddr("10.96.0.20"))
	for _, full := range []bool{true, false} {
		tx := b.newTx(nil, nil, full)
		if !full {
			// bad was applied in a good version before.
			ok := service("bad", func(p *portal.Portal) { p.ClusterIPs = bad.Portals[0].ClusterIPs })
			b.services[bad.Key] = &appliedService{svc: ok, objs: map[portal.PortKey]*objects{}}
		}
		tx.serviceSafely(good.Key, good)
		tx.serviceSafely(bad.Key, bad)
		if tx.err != nil {
			t.Fatalf("full=%v: a render panic must not fail the sync: %v", full, tx.err)
		}
		if len(tx.stats.Panics) != 1 || tx.stats.Panics[0].Service != bad.Key || tx.stats.Panics[0].Backend != "nft" ||
			!strings.Contains(tx.stats.Panics[0].Err.Where, "nft.render") {
			t.Errorf("full=%v: want the render panic of %s, got %+v", full, bad.Key, tx.stats.Panics)
		}
		// Deleted: absent from a full sync, removed in a partial one.
		if s, ok := tx.services[bad.Key]; s != nil || (!full && !ok) {
			t.Errorf("full=%v: the panicking Service must be diffed as deleted, got %+v (present %v)", full, s, ok)
		}
		if s := tx.services[good.Key]; s == nil || s.svc != good || len(s.objs) != 2 {
			t.Errorf("full=%v: the other Service must be rendered, got %+v", full, s)
		}
	}
}
