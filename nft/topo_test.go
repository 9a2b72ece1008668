package nft

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// topo is nsutil's NodeTopology (a node namespace running the backend,
// pod namespaces routed through it, two clients outside the cluster and an
// upstream dead end) with the nft backend programming the node.
type topo struct {
	node, client, client2, upstream *nsutil.NS
	pods                            []*nsutil.NS
	b                               *Backend
}

const (
	nodeIP    = nsutil.NodeIP
	clientIP  = nsutil.ClientIP
	client2IP = nsutil.Client2IP
	nodeIP6   = nsutil.NodeIP6
	clientIP6 = nsutil.ClientIP6
)

func podIP(i int) netip.Addr { return nsutil.PodIP(i) }

func podIP6(i int) netip.Addr { return nsutil.PodIP6(i) }

func newTopo(t *testing.T, pods int) *topo {
	t.Helper()
	nt := nsutil.NewNodeTopology(t, pods)
	tp := &topo{node: nt.Node, client: nt.Client, client2: nt.Client2, upstream: nt.Upstream, pods: nt.Pods}
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
// TCP and UDP. Every test pod hangs off the node, so its endpoints are all
// in the hairpin set unless mut says otherwise.
func service(name string, mut func(p *portal.Portal)) *portal.Service {
	key := portal.ServiceKey{Namespace: "default", Name: name}
	s := &portal.Service{Key: key}
	for _, proto := range []portal.Protocol{portal.TCP, portal.UDP} {
		p := &portal.Portal{Key: portal.PortKey{Service: key, Port: "p", Protocol: proto, Family: portal.IPv4}, Port: 80}
		mut(p)
		if p.Hairpin == nil {
			p.Hairpin = allHairpin(p)
		}
		s.Portals = append(s.Portals, p)
	}
	return s
}

// allHairpin is the hairpin list of a portal whose endpoints are all on
// this node: their distinct addresses, sorted, as the builder lists them.
func allHairpin(p *portal.Portal) []netip.Addr {
	var out []netip.Addr
	for _, ep := range slices.Concat(p.ClusterEndpoints, p.LocalEndpoints) {
		out = append(out, ep.Addr())
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
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

// newTopoWithoutEndpoints is a node with one pod and Service web synced:
// cluster IP clusterIP and node port 30080, TCP and UDP, no endpoints.
func newTopoWithoutEndpoints(t *testing.T) (*topo, *portal.Service) {
	t.Helper()
	tp := newTopo(t, 1)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
	})
	tp.sync(t, snapshot(web), true)
	return tp, web
}

// externalLocalService is a Service with externalTrafficPolicy: Local: a
// cluster IP, node port 30080 and external IP extIP, endpoints pod1 and
// pod2, of which the pods localIdx are on this node.
func externalLocalService(localIdx ...int) *portal.Service {
	return service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
		p.ExternalIPs = []netip.Addr{extIP}
		p.ExternalLocal = true
		p.ClusterEndpoints = eps(8080, 1, 2)
		p.LocalEndpoints = eps(8080, localIdx...)
	})
}

// internalLocalService is a Service with internalTrafficPolicy: Local: a
// cluster IP and node port 30080, endpoints pod1 and pod2, of which the pods
// localIdx are on this node.
func internalLocalService(localIdx ...int) *portal.Service {
	return service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.InternalLocal = true
		p.NodePort = 30080
		p.ClusterEndpoints = eps(8080, 1, 2)
		p.LocalEndpoints = eps(8080, localIdx...)
	})
}
