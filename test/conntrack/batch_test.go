package conntrack_test

import (
	"context"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
)

// The agent hands the cleaner each applied sync through OnApplied, which
// walks the conntrack table at most once per MinInterval and batches what
// arrives sooner into the next walk. A Service that gets an endpoint and
// loses it again within one interval leaves flows DNATed to that endpoint,
// though the first and the last version of the batch have none: the walk
// must count every version the kernel had.
func TestUDPFlowBatchedChangesCountEveryVersion(t *testing.T) {
	const vip = "10.96.0.56"
	// idle is a Service nobody sends to, in every snapshot; brief is the
	// one that changes, listed in Dirty as the Tracker lists it.
	idle := udpService("idle", "10.96.0.57", 0)
	idle.Portals[0].NodePort = 0
	with := func(brief *portal.Service) *portal.Snapshot {
		s := snapshot(idle)
		s.Dirty = []portal.ServiceKey{{Namespace: "default", Name: "brief"}}
		if brief != nil {
			s.Services[brief.Key] = brief
		}
		return s
	}
	for _, tc := range []struct {
		name string
		last *portal.Snapshot // the batch's last sync
	}{
		{"Deleted", with(nil)},
		{"ScaledToZero", with(udpService("brief", vip))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTopo(t, 1)
			// Long enough that the steps below fall inside one interval
			// whatever the machine's load; the walk that ends it is
			// waited for with a generous bound.
			tp.cleaner.MinInterval = 3 * time.Second
			apply := func(snap *portal.Snapshot) {
				if _, err := tp.b.Sync(context.Background(), snap, false); err != nil {
					t.Fatalf("nft sync: %v", err)
				}
				tp.cleaner.OnApplied(snap) // as the runner does after each sync
			}
			// The first call takes idle in, new with an endpoint, and walks
			// at once: the interval starts.
			apply(snapshot(idle))
			apply(with(udpService("brief", vip)))
			apply(with(udpService("brief", vip, 0)))
			s := startSender(t, tp.Client, vip+":53")
			s.waitFor(t, podName(0), time.Time{})

			apply(tc.last)
			began := time.Now()
			deadline := began.Add(10 * time.Second)
			for {
				from := time.Now()
				time.Sleep(300 * time.Millisecond)
				if ok, n := s.only("", from, time.Now()); ok && n > 0 {
					t.Logf("the flow stopped reaching %s %v after the batch's last change",
						podName(0), time.Since(began).Round(time.Millisecond))
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the flow still reaches %s 10s after the batch's last change: %s", podName(0), s.summary(began))
				}
			}
		})
	}
}
