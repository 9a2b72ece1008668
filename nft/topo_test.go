package nft

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// topo is a node namespace running the backend, pod namespaces routed
// through it, a client outside the cluster and an upstream dead end (so that
// traffic for addresses without endpoints is forwarded, not unroutable).
//
//	client  198.51.100.2   --- 198.51.100.1   node 10.244.N.1 --- 10.244.N.2 podN
//	client2 198.51.100.130 --- 198.51.100.129
//	                                         192.0.2.1 --- 192.0.2.2 upstream (default route)
type topo struct {
	node, client, client2, upstream *nsutil.NS
	pods                            []*nsutil.NS
	b                               *Backend
}

const (
	nodeIP    = "198.51.100.1"
	clientIP  = "198.51.100.2"
	client2IP = "198.51.100.130"
	nodeIP6   = "2001:db8:1::1"
	clientIP6 = "2001:db8:1::2"
)

func podIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 2}) }

func podIP6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 0, byte(i + 1), 15: 2})
}

func newTopo(t *testing.T, pods int) *topo {
	t.Helper()
	tp := &topo{
		node:     nsutil.New(t, "ohn-"),
		client:   nsutil.New(t, "ohc-"),
		client2:  nsutil.New(t, "ohc-"),
		upstream: nsutil.New(t, "ohu-"),
	}
	tp.node.Sysctl(t, "net.ipv4.ip_forward", "1")
	tp.node.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	nsutil.Veth(t, tp.node, "to-client", []string{nodeIP + "/25", nodeIP6 + "/64"}, tp.client, "eth0", []string{clientIP + "/25", clientIP6 + "/64"})
	tp.client.IP(t, "route", "add", "default", "via", nodeIP)
	tp.client.IP(t, "-6", "route", "add", "default", "via", nodeIP6)
	nsutil.Veth(t, tp.node, "to-client2", []string{"198.51.100.129/25"}, tp.client2, "eth0", []string{client2IP + "/25"})
	tp.client2.IP(t, "route", "add", "default", "via", "198.51.100.129")
	nsutil.Veth(t, tp.node, "to-up", []string{"192.0.2.1/24", "2001:db8:2::1/64"}, tp.upstream, "eth0", []string{"192.0.2.2/24", "2001:db8:2::2/64"})
	tp.node.IP(t, "route", "add", "default", "via", "192.0.2.2")
	tp.node.IP(t, "-6", "route", "add", "default", "via", "2001:db8:2::2")
	for i := 0; i < pods; i++ {
		p := nsutil.New(t, "ohp-")
		ip := podIP(i)
		gw := netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 1})
		gw6 := netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 0, byte(i + 1), 15: 1})
		nsutil.Veth(t, tp.node, nsutil.Unique("p"), []string{gw.String() + "/24", gw6.String() + "/64"}, p, "eth0", []string{ip.String() + "/24", podIP6(i).String() + "/64"})
		p.IP(t, "route", "add", "default", "via", gw.String())
		p.IP(t, "-6", "route", "add", "default", "via", gw6.String())
		p.Echo(t, "pod"+string(rune('0'+i)), ":8080")
		tp.pods = append(tp.pods, p)
	}
	cfg := dataplane.Config{
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")},
	}
	tp.b = New(cfg, WithNetNS(tp.node.FD()))
	t.Cleanup(func() {
		if err := tp.b.Cleanup(context.Background()); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return tp
}

func (tp *topo) sync(t *testing.T, snap *portal.Snapshot, full bool) dataplane.SyncStats {
	t.Helper()
	st, err := tp.b.Sync(context.Background(), snap, full)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return st
}

// snapshot builds a Snapshot of the given services, all marked dirty.
func snapshot(svcs ...*portal.Service) *portal.Snapshot {
	s := &portal.Snapshot{
		Node:     portal.Node{Name: "node", NodePortAddrs: []netip.Addr{netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP6)}},
		Services: map[portal.ServiceKey]*portal.Service{},
	}
	for _, svc := range svcs {
		s.Services[svc.Key] = svc
		s.Dirty = append(s.Dirty, svc.Key)
	}
	return s
}

func eps(port uint16, idx ...int) []netip.AddrPort {
	var out []netip.AddrPort
	for _, i := range idx {
		out = append(out, netip.AddrPortFrom(podIP(i), port))
	}
	return out
}

// service is a one-port Service with the given portal fields set on both
// TCP and UDP.
func service(name string, mut func(p *portal.Portal)) *portal.Service {
	key := portal.ServiceKey{Namespace: "default", Name: name}
	s := &portal.Service{Key: key}
	for _, proto := range []portal.Protocol{portal.TCP, portal.UDP} {
		p := &portal.Portal{Key: portal.PortKey{Service: key, Port: "p", Protocol: proto, Family: portal.IPv4}, Port: 80}
		mut(p)
		s.Portals = append(s.Portals, p)
	}
	return s
}

// ask sends count requests and returns how often each server answered and
// the last source address seen.
func ask(t *testing.T, from *nsutil.NS, network, addr string, count int) (map[string]int, string) {
	t.Helper()
	seen := map[string]int{}
	src := ""
	for i := 0; i < count; i++ {
		r, err := from.Ask(network, addr, 2*time.Second)
		if err != nil {
			t.Fatalf("%s %s from %s: %v", network, addr, from.Name, err)
		}
		seen[r.Name]++
		src = r.Source
	}
	return seen, src
}
