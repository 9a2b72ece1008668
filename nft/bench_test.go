package nft

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// bigSnapshot returns n Services of one TCP port with a cluster IP, a
// NodePort and eps endpoints each.
func bigSnapshot(n, eps int) *portal.Snapshot {
	snap := &portal.Snapshot{
		Node:     portal.Node{NodePortAddrs: []netip.Addr{netip.MustParseAddr("198.51.100.1")}},
		Services: make(map[portal.ServiceKey]*portal.Service, n),
	}
	for i := 0; i < n; i++ {
		snap.Services[bigService(i, eps, 0)] = nil
	}
	for k := range snap.Services {
		var i int
		fmt.Sscanf(k.Name, "svc-%d", &i)
		snap.Services[k] = makeBigService(i, eps, 0)
	}
	return snap
}

func bigService(i, _, _ int) portal.ServiceKey {
	return portal.ServiceKey{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
}

// makeBigService builds Service i; shift moves its endpoints, to make a change.
func makeBigService(i, eps, shift int) *portal.Service {
	key := bigService(i, eps, shift)
	p := &portal.Portal{
		Key:        portal.PortKey{Service: key, Port: "http", Protocol: portal.TCP, Family: portal.IPv4},
		Port:       80,
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
		NodePort:   uint16(20000 + i),
	}
	for e := 0; e < eps; e++ {
		n := i*eps + e + shift
		p.ClusterEndpoints = append(p.ClusterEndpoints,
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(128 + n>>16), byte(n >> 8), byte(n)}), 8080))
	}
	return &portal.Service{Key: key, Portals: []*portal.Portal{p}}
}

func benchBackend(b *testing.B) *Backend { return benchBackendT(b) }

func benchBackendT(b testing.TB) *Backend {
	ns := nsutil.New(b, "ohb-")
	be := New(dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")}}, WithNetNS(ns.FD()))
	b.Cleanup(func() { _ = be.Cleanup(context.Background()) })
	return be
}

func benchFullSync(b *testing.B, n int) {
	be := benchBackend(b)
	snap := bigSnapshot(n, 10)
	ctx := context.Background()
	b.ResetTimer()
	var st dataplane.SyncStats
	for i := 0; i < b.N; i++ {
		var err error
		if st, err = be.Sync(ctx, snap, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.Messages), "msgs/sync")
	// What the backend keeps (plus the snapshot it was given) once synced.
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MiB")
	runtime.KeepAlive(snap)
}

func BenchmarkFullSync1k(b *testing.B)  { benchFullSync(b, 1000) }
func BenchmarkFullSync10k(b *testing.B) { benchFullSync(b, 10000) }

// BenchmarkEndpointChange10k is one Service's endpoints changing while
// 10k Services are programmed: the cost of an incremental sync.
func BenchmarkEndpointChange10k(b *testing.B) {
	be := benchBackend(b)
	snap := bigSnapshot(10000, 10)
	ctx := context.Background()
	if _, err := be.Sync(ctx, snap, true); err != nil {
		b.Fatal(err)
	}
	key := bigService(42, 10, 0)
	b.ResetTimer()
	var st dataplane.SyncStats
	for i := 0; i < b.N; i++ {
		snap.Services[key] = makeBigService(42, 10, 1+i%2)
		snap.Dirty = []portal.ServiceKey{key}
		var err error
		if st, err = be.Sync(ctx, snap, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.Messages), "msgs/sync")
}
