package nft

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})},
	}
	if i < 30000 { // node ports are 16 bits: the first 30k Services have one
		p.NodePort = uint16(20000 + i)
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

// fullSyncMode is the state a benchmarked full sync starts from.
type fullSyncMode int

const (
	// fresh: no onehop table in the kernel (a node's first start).
	fresh fullSyncMode = iota
	// restart: the table the last process left, read back by a new
	// process and reconciled in place.
	restart
	// steady: the same process again, the kernel untouched since (the
	// periodic full sync): compared with memory, nothing read back.
	steady
	// restartWatched: restart, with the backend's events watcher
	// running, as in the agent (its socket a listener of the kernel's
	// nftables events).
	restartWatched
)

// watch runs be's events watcher until stopped, and fails the benchmark
// on a report: the backend's own syncs are not someone else's change.
func watch(b *testing.B, be *Backend) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := be.Watch(ctx)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			if !c.Lost {
				b.Errorf("the backend's own sync reported as a foreign change: %v", c)
			}
		}
	}()
	return func() { cancel(); <-done }
}

func benchFullSync(b *testing.B, n int, mode fullSyncMode) {
	be := benchBackend(b)
	snap := bigSnapshot(n, 10)
	ctx := context.Background()
	if mode != fresh {
		if _, err := be.Sync(ctx, snap, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var st dataplane.SyncStats
	stopWatch := func() {}
	defer func() { stopWatch() }()
	for i := 0; i < b.N; i++ {
		switch mode {
		case fresh:
			b.StopTimer()
			if err := be.Cleanup(ctx); err != nil {
				b.Fatal(err)
			}
			be = New(be.cfg, WithNetNS(be.netnsFD))
			b.StartTimer()
		case restart, restartWatched:
			be = New(be.cfg, WithNetNS(be.netnsFD))
			if mode == restartWatched {
				b.StopTimer()
				stopWatch() // the last process's
				stopWatch = watch(b, be)
				b.StartTimer()
			}
		}
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

func BenchmarkFullSync1k(b *testing.B)         { benchFullSync(b, 1000, fresh) }
func BenchmarkFullSync10k(b *testing.B)        { benchFullSync(b, 10000, fresh) }
func BenchmarkFullSyncRestart10k(b *testing.B) { benchFullSync(b, 10000, restart) }
func BenchmarkFullSyncSteady10k(b *testing.B)  { benchFullSync(b, 10000, steady) }
func BenchmarkFullSyncRestartWatched10k(b *testing.B) {
	benchFullSync(b, 10000, restartWatched)
}
func BenchmarkFullSync100k(b *testing.B) { benchFullSync(b, 100000, fresh) }
func BenchmarkFullSyncRestart100k(b *testing.B) {
	benchFullSync(b, 100000, restart)
}

// BenchmarkEndpointChange10k is one Service's endpoints changing while
// 10k Services are programmed: the cost of an incremental sync.
func BenchmarkEndpointChange10k(b *testing.B) {
	be := benchBackend(b)
	snap := bigSnapshot(10000, 10)
	ctx := context.Background()
	if _, err := be.Sync(ctx, snap, true); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	benchChanges(b, be, snap, func(i int) *portal.Service { return makeBigService(42, 10, 1+i%2) })
}

// BenchmarkAddServices10k is a storm of new Services beside 10k: each
// sync adds five, as a sync in a burst of creations does. It reports the
// process's CPU per sync, the kernel's included (a new chain makes the
// kernel validate the whole table).
func BenchmarkAddServices10k(b *testing.B) {
	be := benchBackend(b)
	snap := bigSnapshot(10000, 10)
	ctx := context.Background()
	if _, err := be.Sync(ctx, snap, true); err != nil {
		b.Fatal(err)
	}
	cpu0 := processCPU(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		snap.Dirty = snap.Dirty[:0]
		for j := range 5 {
			s := makeBigService(10000+5*i+j, 10, 0)
			snap.Services[s.Key] = s
			snap.Dirty = append(snap.Dirty, s.Key)
		}
		if _, err := be.Sync(ctx, snap, false); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/sync")
}

// processCPU is the process's user and system time so far.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchChanges syncs b.N changes of one Service, the i-th made by mk(i),
// and reports the messages of the last sync.
func benchChanges(b *testing.B, be *Backend, snap *portal.Snapshot, mk func(i int) *portal.Service) {
	var st dataplane.SyncStats
	for i := 0; i < b.N; i++ {
		s := mk(i)
		snap.Services[s.Key] = s
		snap.Dirty = []portal.ServiceKey{s.Key}
		var err error
		if st, err = be.Sync(context.Background(), snap, false); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.Messages), "msgs/sync")
}

// rangesService is a LoadBalancer Service with ports TCP ports, one
// load-balancer IP and n source ranges; shift moves its endpoints.
func rangesService(ports, n, shift int) *portal.Service {
	key := portal.ServiceKey{Namespace: "bench", Name: "ranges"}
	ranges := make([]netip.Prefix, n)
	for i := range ranges {
		// /25s that neither overlap nor touch: n intervals.
		ranges[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(i >> 8), byte(i), 0}), 25)
	}
	s := &portal.Service{Key: key}
	for p := 0; p < ports; p++ {
		s.Portals = append(s.Portals, &portal.Portal{
			Key:             portal.PortKey{Service: key, Port: fmt.Sprintf("p%d", p), Protocol: portal.TCP, Family: portal.IPv4},
			Port:            uint16(1000 + p),
			ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.97.0.1")},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.99")},
			SourceRanges:    ranges,
			ClusterEndpoints: []netip.AddrPort{
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, 0, byte(1 + shift)}), 8080),
				netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, 0, byte(2 + shift)}), 8080),
			},
		})
	}
	slices.SortFunc(s.Portals, func(a, b *portal.Portal) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	return s
}

// BenchmarkSourceRanges is the cost of the syncs of one Service with 100
// ports behind 1, 100 and 10,000 source ranges, beside 1,000 other
// Services: created and deleted (add), its endpoints changed (endpoints),
// and another Service's endpoints changed (other). The ranges are one set:
// only the set's elements grow with them, never the rules.
func BenchmarkSourceRanges(b *testing.B) {
	for _, n := range []int{1, 100, 10000} {
		b.Run(fmt.Sprintf("ranges=%d", n), func(b *testing.B) {
			be := benchBackend(b)
			snap := bigSnapshot(1000, 2)
			ctx := context.Background()
			if _, err := be.Sync(ctx, snap, true); err != nil {
				b.Fatal(err)
			}
			key := portal.ServiceKey{Namespace: "bench", Name: "ranges"}
			sync := func(b *testing.B) dataplane.SyncStats {
				snap.Dirty = []portal.ServiceKey{key}
				st, err := be.Sync(ctx, snap, false)
				if err != nil {
					b.Fatal(err)
				}
				return st
			}
			b.Run("add", func(b *testing.B) {
				var msgs int
				for i := 0; i < b.N; i++ {
					snap.Services[key] = rangesService(100, n, 0)
					msgs = sync(b).Messages
					delete(snap.Services, key)
					sync(b)
				}
				b.ReportMetric(float64(msgs), "msgs/add")
			})
			snap.Services[key] = rangesService(100, n, 0)
			sync(b)
			b.Run("endpoints", func(b *testing.B) {
				benchChanges(b, be, snap, func(i int) *portal.Service { return rangesService(100, n, 1+i%2) })
			})
			b.Run("other", func(b *testing.B) {
				benchChanges(b, be, snap, func(i int) *portal.Service { return makeBigService(42, 2, 1+i%2) })
			})
		})
	}
}
