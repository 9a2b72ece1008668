package nft

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// snapFunc is a dataplane.SnapshotSource that asks a function.
type snapFunc func() *portal.Snapshot

func (f snapFunc) Snapshot() (*portal.Snapshot, []time.Time) { return f(), nil }

// watchedRunner runs tp's backend under a Runner whose periodic check and
// syncs wait an hour: only the backend's Watch can explain a repair soon.
type watchedRunner struct {
	runner  *dataplane.Runner
	reg     *prometheus.Registry
	applied atomic.Int32
	repairs atomic.Int32
}

func runWatched(t *testing.T, tp *topo, src dataplane.SnapshotSource) *watchedRunner {
	t.Helper()
	w := &watchedRunner{reg: prometheus.NewRegistry()}
	hour := time.Hour
	w.runner = dataplane.NewRunner(tp.b, src, dataplane.RunnerConfig{SyncPeriod: hour, FullSyncPeriod: hour, CheckPeriod: hour},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil, dataplane.NewMetrics(w.reg))
	w.runner.OnApplied(func(*portal.Snapshot) { w.applied.Add(1) })
	w.runner.OnRepair(func(c dataplane.KernelChange) {
		t.Logf("repair: %s", c)
		w.repairs.Add(1)
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.runner.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	w.waitApplied(t, 1)
	return w
}

func (w *watchedRunner) waitApplied(t *testing.T, n int32) {
	t.Helper()
	waitFor(t, 5*time.Second, "sync", func() bool { return w.applied.Load() >= n })
}

// metric is onehop_kernel_repairs_total{backend="nft"}.
func (w *watchedRunner) metric(t *testing.T) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "onehop_kernel_repairs_total" {
			for _, m := range mf.GetMetric() {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s within %v", what, d)
		}
	}
}

// watchTopo is a node with three pods and Service web (two endpoints) synced by a
// watched runner, and a connection of someone else's to its namespace.
func watchTopo(t *testing.T) (*topo, *watchedRunner, *nftables.Conn, *nftables.Table) {
	t.Helper()
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1, 2)
	})
	snap := snapshot(web)
	w := runWatched(t, tp, snapFunc(func() *portal.Snapshot { return snap }))
	other, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	return tp, w, other, &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// expectOneRepair waits until restored says the table is whole again,
// and checks that exactly one repair, counted in the metric, did it.
func expectOneRepair(t *testing.T, tp *topo, w *watchedRunner, restored func() bool) {
	t.Helper()
	waitFor(t, 3*time.Second, "repair", restored)
	time.Sleep(2 * watchMaxWait) // a second report would come by now
	if n := w.repairs.Load(); n != 1 {
		t.Errorf("%d repairs, want 1", n)
	}
	if m := w.metric(t); m != 1 {
		t.Errorf("onehop_kernel_repairs_total = %v, want 1", m)
	}
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 20); len(seen) != 2 {
		t.Errorf("want both endpoints after the repair, got %v", seen)
	}
}

func TestWatchRepairsADeletedEndpointElement(t *testing.T) {
	t.Parallel()
	tp, w, other, tb := watchTopo(t)
	sets, err := other.GetSets(tb)
	if err != nil {
		t.Fatal(err)
	}
	var set *nftables.Set
	var els []nftables.SetElement
	for _, s := range sets {
		if strings.HasPrefix(s.Name, "flat4-") {
			if els, err = other.GetSetElements(s); err == nil && len(els) > 0 {
				set = s
				break
			}
		}
	}
	if set == nil {
		t.Fatal("no flat map holds an element")
	}
	if err := other.SetDeleteElements(set, []nftables.SetElement{{Key: els[0].Key}}); err != nil {
		t.Fatal(err)
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	expectOneRepair(t, tp, w, func() bool {
		now, err := other.GetSetElements(set)
		return err == nil && len(now) == len(els)
	})
}

// The flat chain picks the endpoint of every flat way in: flushed, no
// flat Service answers until it is repaired.
func TestWatchRepairsAFlushedFlatChain(t *testing.T) {
	t.Parallel()
	tp, w, other, tb := watchTopo(t)
	chains, err := other.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	var chain *nftables.Chain
	for _, c := range chains {
		if c.Table.Name == TableName && c.Name == chainFlat(portal.IPv4) {
			chain = c
		}
	}
	if chain == nil {
		t.Fatal("no flat chain")
	}
	rules, err := other.GetRules(tb, chain)
	if err != nil || len(rules) == 0 {
		t.Fatalf("chain %s: %d rules, %v", chain.Name, len(rules), err)
	}
	other.FlushChain(chain)
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	expectOneRepair(t, tp, w, func() bool {
		now, err := other.GetRules(tb, chain)
		return err == nil && len(now) == len(rules)
	})
}

func TestWatchIgnoresOwnChanges(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	var n atomic.Int32
	w := runWatched(t, tp, snapFunc(func() *portal.Snapshot {
		i := int(n.Load())
		web := service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, 1+i%3)
		})
		db := service("db", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
			p.ClusterEndpoints = eps(5432, 1, 2, 3)
		})
		s := snapshot(web)
		if i%2 == 1 { // db comes and goes: chains, rules and maps
			s = snapshot(web, db)
		}
		s.Dirty = []portal.ServiceKey{web.Key, db.Key}
		return s
	}))
	for i := int32(1); i <= 40; i++ {
		n.Add(1)
		w.runner.Trigger()
		w.waitApplied(t, i+1)
	}
	time.Sleep(2 * watchMaxWait)
	if r := w.repairs.Load(); r != 0 {
		t.Errorf("onehop's own syncs caused %d repairs", r)
	}
	if m := w.metric(t); m != 0 {
		t.Errorf("onehop_kernel_repairs_total = %v, want 0", m)
	}
}

// TestWatchHearsAChangeDuringAQuietSync: a sync of more elements than
// quietAbove goes out while the events socket is out of its group, so the
// kernel builds no event per element; someone else's change in that
// window is reported as lost events, and the next full sync repairs it.
// Without the generation check the change would go unheard.
func TestWatchHearsAChangeDuringAQuietSync(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	webIP := netip.MustParseAddr("10.99.0.10") // outside the big snapshot's
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{webIP}
		p.ClusterEndpoints = eps(8080, 1, 2)
	})
	snap := bigSnapshot(quietAbove/20+10, 10) // x 10 endpoints x 2 ways in
	snap.Node = snapshot().Node
	snap.Services[web.Key] = web
	for k := range snap.Services {
		snap.Dirty = append(snap.Dirty, k)
	}
	tp.sync(t, snapshot(web), true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := tp.b.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tb := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	// raceSync deletes web's gate element of proto between the next
	// sync's diff and its commit.
	raceSync := func(proto portal.Protocol) {
		tp.b.beforeCommit = func() {
			tp.b.beforeCommit = nil
			if err := other.SetDeleteElements(&nftables.Set{Table: tb, Name: setFlatGate(portal.IPv4)},
				[]nftables.SetElement{{Key: vipKey(webIP, proto, 80)}}); err != nil {
				t.Error(err)
			}
			if err := other.Flush(); err != nil {
				t.Error(err)
			}
		}
	}
	raceSync(portal.TCP)
	tp.sync(t, snap, false)
	select {
	case c := <-ch:
		if !c.Lost {
			t.Errorf("reported %v, want lost events", c)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the change made during the quiet sync was not reported")
	}
	// The full sync that answers the report goes out with the socket in
	// its group: another change in its window is heard as what it is, not
	// as lost events again (which a neighbour committing often would make
	// a loop of full syncs).
	raceSync(portal.UDP)
	if st := tp.sync(t, snap, true); !st.ReadBack {
		t.Errorf("the full sync after lost events did not read the table back")
	}
	select {
	case c := <-ch:
		if c.Lost || len(c.Seen) == 0 {
			t.Errorf("the change during the full sync after the report: %+v, want it heard as a change", c)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the change made during the full sync after the report was not reported")
	}
	tp.sync(t, snap, true)
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.99.0.10:80", 20); len(seen) != 2 {
		t.Errorf("want both endpoints after the repair, got %v", seen)
	}
}
