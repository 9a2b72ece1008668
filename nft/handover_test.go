package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// TestHandOverInOneSync: an address one Service lets go and another takes
// in the same sync is programmed for the taker, whichever of the two the
// sync looks at first (found by TestChurn, seed 2).
func TestHandOverInOneSync(t *testing.T) {
	t.Parallel()
	ns := nsutil.New(t, "ohh-")
	b := New(dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, WithNetNS(ns.FD()))
	t.Cleanup(func() { _ = b.Cleanup(context.Background()) })
	ext := netip.MustParseAddr("203.0.113.7")
	mk := func(name string, cip string, extIPs ...netip.Addr) *portal.Service {
		return service(name, func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{netip.MustParseAddr(cip)}
			p.ExternalIPs = extIPs
			p.ClusterEndpoints = eps(8080, 0)
		})
	}
	ctx := context.Background()
	if _, err := b.Sync(ctx, snapshot(mk("a", "10.96.0.20", ext), mk("b", "10.96.0.21")), true); err != nil {
		t.Fatal(err)
	}
	snap := snapshot(mk("a", "10.96.0.20"), mk("b", "10.96.0.21", ext))
	snap.Dirty = []portal.ServiceKey{{Namespace: "default", Name: "b"}, {Namespace: "default", Name: "a"}}
	if _, err := b.Sync(ctx, snap, false); err != nil {
		t.Fatal(err)
	}
	d, err := b.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Ports {
		for _, e := range p.Entries {
			if e.Kind == entryExternalIP && strings.HasPrefix(p.Service, "default/b:") {
				return
			}
		}
	}
	t.Errorf("external IP %v handed from a to b in one sync is programmed for neither:\n%s", ext, d.Raw)
}

// TestFullSyncRelabelsHandedOverAddress: a full sync that finds an element
// with the right key and verdict but another Service's comment rewrites
// it, so that dump-rules names the Service that holds the address now
// (found by TestChurn, seed 23: an address without endpoints, goto reject,
// handed over between two full syncs).
func TestFullSyncRelabelsHandedOverAddress(t *testing.T) {
	t.Parallel()
	ns := nsutil.New(t, "ohh-")
	b := New(dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, WithNetNS(ns.FD()))
	t.Cleanup(func() { _ = b.Cleanup(context.Background()) })
	ext := netip.MustParseAddr("203.0.113.7")
	mk := func(name string, cip string, extIPs ...netip.Addr) *portal.Service {
		return service(name, func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{netip.MustParseAddr(cip)}
			p.ExternalIPs = extIPs
		})
	}
	ctx := context.Background()
	if _, err := b.Sync(ctx, snapshot(mk("a", "10.96.0.20", ext), mk("b", "10.96.0.21")), true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sync(ctx, snapshot(mk("a", "10.96.0.20"), mk("b", "10.96.0.21", ext)), true); err != nil {
		t.Fatal(err)
	}
	d, err := b.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Ports {
		for _, e := range p.Entries {
			if e.Kind == entryExternalIP && !strings.HasPrefix(p.Service, "default/b:") {
				t.Errorf("external IP %v handed from a to b is listed under %s", ext, p.Service)
			}
		}
	}
}
