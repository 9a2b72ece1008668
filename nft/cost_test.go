package nft

import (
	"context"
	"fmt"
	"testing"

	"github.com/onehop/onehop/portal"
)

// BenchmarkChangeCost is the cost curve of one change beside n Services
// x 10 endpoints: a Service added (and deleted again), one endpoint
// replaced, and the endpoint count stepping 10 -> 11 -> 10. ns/op is the
// sync, the kernel's work on its transaction included; cpu-ms/op the
// process's user and system time (the kernel's netlink work is the
// process's system time). A flat layout keeps each flat as n grows.
func BenchmarkChangeCost(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000, 100000} {
		be := benchBackend(b)
		snap := bigSnapshot(n, 10)
		if _, err := be.Sync(context.Background(), snap, true); err != nil {
			b.Fatal(err)
		}
		run := func(name string, mk func(i int) (portal.ServiceKey, *portal.Service)) {
			b.Run(fmt.Sprintf("%s/%dk", name, n/1000), func(b *testing.B) {
				cpu0 := processCPU(b)
				for i := 0; i < b.N; i++ {
					k, s := mk(i)
					snap.Services[k] = s
					if s == nil {
						delete(snap.Services, k)
					}
					snap.Dirty = []portal.ServiceKey{k}
					if _, err := be.Sync(context.Background(), snap, false); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
		run("add", func(i int) (portal.ServiceKey, *portal.Service) {
			s := makeBigService(n, 10, 0)
			if i%2 == 1 {
				return s.Key, nil
			}
			return s.Key, s
		})
		run("endpoint", func(i int) (portal.ServiceKey, *portal.Service) {
			s := makeBigService(42, 10, 1+i%2)
			return s.Key, s
		})
		run("count", func(i int) (portal.ServiceKey, *portal.Service) {
			s := makeBigService(43, 10+(i+1)%2, 0)
			return s.Key, s
		})
		_ = be.Cleanup(context.Background())
	}
}
