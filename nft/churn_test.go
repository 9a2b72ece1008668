package nft

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/test/nsutil"
)

var churnSeed = flag.Uint64("churn.seed", 0, "seed of TestChurn's mutations (default: $ONEHOP_CHURN_SEED, else time-based)")

// TestChurn is a model-based test of incremental syncs against the real
// kernel. A seeded generator applies random valid mutations to a model of
// the Services a node serves (types and ways in, ports, protocols, both
// families, traffic policies, affinity, source ranges, endpoints ready and
// terminating, addresses handed from one Service to another, Services
// deleted and re-created, node addresses, pod external IPs), in batches
// synced incrementally with the Dirty list set; every few batches a full
// sync, and now and then a new Backend on the same table, as after an agent
// restart. After every batch:
//
//   - the sync did not fail;
//   - the table read back equals the one a fresh Backend builds from the
//     same snapshot in an empty namespace with one full sync (chain ids and
//     endpoint-map shards normalised away, endpoints resolved per rule), and
//     every way into every portal of the model is in it;
//   - requests from the client to a few sampled ways in reach an endpoint
//     the model allows, or are refused when the Service has none.
//
// A failure names the seed and the batch; -churn.seed=N replays it.
// ONEHOP_CHURN_SECONDS sets how long it runs (default 20),
// ONEHOP_CHURN_BATCH the average size of a large batch (default 200; a third
// of the batches are small). The mutation rate it reaches is logged; the
// fixed cost of checking a batch (reading two tables back, building the
// fresh one) bounds it, so larger batches reach more mutations a second.
func TestChurn(t *testing.T) {
	t.Parallel()
	seed := *churnSeed
	if seed == 0 {
		if v, err := strconv.ParseUint(os.Getenv("ONEHOP_CHURN_SEED"), 10, 64); err == nil {
			seed = v
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	seconds := envInt("ONEHOP_CHURN_SECONDS", 20)
	batchSize := envInt("ONEHOP_CHURN_BATCH", churnBatch)
	t.Logf("churn seed %d (replay: go test ./nft -run TestChurn -churn.seed=%d)", seed, seed)

	tp := newTopo(t, churnPods)
	oracleNS := nsutil.New(t, "ohx-")
	m := newChurnModel(seed, hasSCTP())
	ctx := context.Background()

	var batches, mutations, fulls, restarts, probes int
	var syncTime, readTime, oracleTime, probeTime time.Duration
	start := time.Now()
	deadline := start.Add(time.Duration(seconds) * time.Second)
	for batch := 1; time.Now().Before(deadline); batch++ {
		kind := "incremental"
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d, batch %d (%s sync): %s\nreplay: go test ./nft -run TestChurn -churn.seed=%d", seed, batch, kind, fmt.Sprintf(format, args...), seed)
		}
		// A third of the batches are a few mutations, so that single
		// changes are checked on their own; the others average batchSize.
		n := 1 + m.rng.IntN(2*batchSize)
		if m.rng.IntN(3) == 0 {
			n = 1 + m.rng.IntN(8)
		}
		for range n {
			m.mutate()
		}
		mutations += n
		snap := m.snapshot()
		full := batch%churnFullEvery == 0
		if batch%churnRestartEvery == 0 {
			tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
			full = true
			restarts++
			kind = "restart's full"
		}
		if full {
			fulls++
			if kind == "incremental" {
				kind = "full"
			}
		}
		syncStart := time.Now()
		st, err := tp.b.Sync(ctx, snap, full)
		syncTime += time.Since(syncStart)
		if err != nil {
			fail("sync (full=%v) of %d mutations failed: %v\nmutations:\n%s", full, n, err, m.journal())
		}
		if len(st.Panics) > 0 {
			fail("sync panicked: %v", st.Panics)
		}
		if err := tp.b.Check(ctx); err != nil {
			fail("the drift check after the sync: %v", err)
		}

		checkStart := time.Now()
		got, err := readKernelOf(tp.node.FD(), tp.b)
		if err != nil {
			fail("read the table: %v", err)
		}
		if msg := m.checkWaysIn(got); msg != "" {
			fail("the table differs from the model:\n%s\nmutations:\n%s", msg, m.journal())
		}
		oracleStart := time.Now()
		readTime += oracleStart.Sub(checkStart)
		oracle := New(tp.b.cfg, WithNetNS(oracleNS.FD()))
		if err := oracle.Cleanup(ctx); err != nil {
			fail("oracle cleanup: %v", err)
		}
		if _, err := oracle.Sync(ctx, snap, true); err != nil {
			fail("full sync of the same snapshot into an empty namespace failed: %v", err)
		}
		want, err := readKernelOf(oracleNS.FD(), oracle)
		if err != nil {
			fail("read the oracle's table: %v", err)
		}
		if nw, ng := churnNormal(want), churnNormal(got); nw != ng {
			d := lineDiff(nw, ng)
			if d == "" {
				d = "the same lines in another order:\n" + ng
			}
			fail("the table after %d mutations (full=%v) differs from a fresh full sync of the same snapshot (- fresh, + incremental):\n%s\nmutations:\n%s", n, full, d, m.journal())
		}
		probeStart := time.Now()
		oracleTime += probeStart.Sub(oracleStart)
		for _, p := range m.probes(churnProbes) {
			probes++
			if msg := p.run(tp); msg != "" {
				fail("%s\nmutations:\n%s", msg, m.journal())
			}
		}
		probeTime += time.Since(probeStart)
		batches++
		m.done()
	}
	elapsed := time.Since(start)
	t.Logf("churn: time in syncs %v, reading back %v, the fresh table %v, requests %v", syncTime.Round(time.Millisecond), readTime.Round(time.Millisecond), oracleTime.Round(time.Millisecond), probeTime.Round(time.Millisecond))
	t.Logf("churn: %d mutations in %d batches (%d full syncs, %d restarts) checked in %v: %.0f mutations/s overall; syncs took %v (%.0f mutations/s of sync time); %d requests; %d Services at the end",
		mutations, batches, fulls, restarts, elapsed.Round(time.Millisecond), float64(mutations)/elapsed.Seconds(),
		syncTime.Round(time.Millisecond), float64(mutations)/syncTime.Seconds(), probes, len(m.svcs))
}

// Sizes of TestChurn.
const (
	churnPods         = 4
	churnMaxServices  = 40
	churnBatch        = 200 // mutations in a large batch, on average (ONEHOP_CHURN_BATCH)
	churnFullEvery    = 10
	churnRestartEvery = 37
	churnProbes       = 4 // requests per batch
)

// hasSCTP reports whether this kernel has SCTP sockets; without them the
// model leaves SCTP out, since no request could prove it.
func hasSCTP() bool {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}
