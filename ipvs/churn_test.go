package ipvs

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

var (
	churnSeedFlag    = flag.Uint64("churn.seed", 0, "seed of TestChurn's mutations (default: $ONEHOP_CHURN_SEED, else time-based)")
	churnSecondsFlag = flag.Int("churn.seconds", 0, "how long TestChurn runs (default: $ONEHOP_CHURN_SECONDS, else 20)")
)

// TestChurn is a model-based test of the IPVS backend's syncs against the
// real kernel (it runs in the test VM: go test ./test/vm). A seeded
// generator applies random valid mutations to a model of the Services a
// node serves: types and ways in (cluster IPs, NodePorts, external and
// load-balancer IPs), ports and protocols, both families, traffic
// policies, affinity on, off and re-timed, the scheduler annotation, source
// ranges, endpoints ready, terminating, local and gone, addresses handed
// from one Service to another, Services deleted and re-created, and the
// node's NodePort addresses, under one of four backend configurations
// (churnConfigs, picked by the seed). Batches are synced incrementally
// with Dirty set; every few batches a full sync, and now and then a new
// Backend on the same kernel state and state file, as after an agent
// restart. After every
// batch:
//
//   - the sync did not fail, and Check passes;
//   - what the kernel holds (virtual servers and their live destinations,
//     the dummy's addresses, onehop's iptables rules of both families), read
//     back as a full sync reads it, equals the plan a full sync of the same
//     snapshot would apply; destinations at weight 0 are ones the backend is
//     draining;
//   - every way into every portal of the model is a virtual server with
//     the model's endpoints, scheduler and persistence;
//   - requests from a client outside the cluster to a few sampled ways in
//     reach an endpoint the model allows (seeing the client's address only
//     under the Local policy), are refused when there is none, and are
//     dropped when source ranges leave the client out.
//
// A failure names the seed and the batch: -churn.seed=N (or
// ONEHOP_CHURN_SEED=N) replays it. -churn.seconds or ONEHOP_CHURN_SECONDS
// sets how long it runs (default 20 s, and at least churnMinBatches
// batches), ONEHOP_CHURN_BATCH the average size of a large batch (default
// 25; a third of the batches are one to three mutations). The test VM
// passes the host's ONEHOP_CHURN_* through. The fixed cost of a batch
// (iptables commands, reading the kernel back, requests) bounds the
// mutation rate; larger batches reach more mutations a second.
func TestChurn(t *testing.T) {
	seed := *churnSeedFlag
	if seed == 0 {
		seed, _ = strconv.ParseUint(os.Getenv("ONEHOP_CHURN_SEED"), 10, 64)
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	seconds := *churnSecondsFlag
	if seconds == 0 {
		seconds, _ = strconv.Atoi(os.Getenv("ONEHOP_CHURN_SECONDS"))
	}
	if seconds <= 0 {
		seconds = 20
	}
	t.Logf("churn seed %d (replay: ONEHOP_CHURN_SEED=%d ONEHOP_VM_RUN=TestChurn go test ./test/vm, or -churn.seed=%d in the VM)", seed, seed, seed)

	n := newTestNet(t, churnPods)
	// IPVS refuses a connection without endpoints with ICMP port
	// unreachable, which the kernel rate-limits per client (a burst of 6,
	// then one a second): the probes would see timeouts instead.
	for _, kv := range [][2]string{{"net.ipv4.icmp_ratelimit", "0"}, {"net.ipv6.icmp.ratelimit", "0"}} {
		if err := nsutil.Sysctl(n.node, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	state := filepath.Join(t.TempDir(), "state.json")
	opts := []Option{WithStateFile(state), WithDrainTimeout(3 * time.Second)}
	m := newChurnModel(seed)
	t.Logf("churn config: %s", m.cfgName)
	tb := n.backend(m.cfg, opts...)
	ctx := context.Background()

	var batches, mutations, fulls, restarts, probes, failed int
	var syncTime, checkTime, probeTime time.Duration
	start := time.Now()
	deadline := start.Add(time.Duration(seconds) * time.Second)
	batchSize := churnBatch
	if v, err := strconv.Atoi(os.Getenv("ONEHOP_CHURN_BATCH")); err == nil && v > 0 {
		batchSize = v
	}
	// At least churnMinBatches, however slow the machine: enough for full
	// syncs and a restart.
	for batch := 1; time.Now().Before(deadline) || batch <= churnMinBatches; batch++ {
		kind := "incremental"
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d, batch %d (%s sync): %s\nmutations of this batch:\n\t%s\nreplay: ONEHOP_CHURN_SEED=%d ONEHOP_VM_RUN=TestChurn go test ./test/vm",
				seed, batch, kind, fmt.Sprintf(format, args...), strings.Join(m.log, "\n\t"), seed)
		}
		// A third of the batches are one to three mutations, so that
		// single changes are checked on their own.
		size := 1 + m.rng.IntN(2*batchSize)
		if m.rng.IntN(3) == 0 {
			size = 1 + m.rng.IntN(3)
		}
		for range size {
			m.mutate()
		}
		mutations += size
		snap := m.snapshot()
		full := batch%churnFullEvery == 0
		if batch%churnRestartEvery == 0 {
			old := tb.b
			if err := nsutil.Do(tb.ns, func() (err error) { tb.b, err = New(m.cfg, opts...); return err }); err != nil {
				fail("a new Backend: %v", err)
			}
			old.Close()
			full, kind = true, "restart's full"
			restarts++
		}
		if full {
			fulls++
			if kind == "incremental" {
				kind = "full"
			}
		}
		syncStart := time.Now()
		err := tb.do(func(b *Backend) error {
			st, err := b.Sync(ctx, snap, full)
			if err == nil && len(st.Panics) > 0 {
				err = fmt.Errorf("panics: %v", st.Panics)
			}
			return err
		})
		syncTime += time.Since(syncStart)
		if err != nil {
			failed++
			fail("sync of %d mutations failed: %v", size, err)
		}
		checkStart := time.Now()
		if err := tb.do(func(b *Backend) error { return b.Check(ctx) }); err != nil {
			fail("Check after the sync: %v", err)
		}
		if msg := m.compare(tb, snap); msg != "" {
			fail("%s", msg)
		}
		probeStart := time.Now()
		checkTime += probeStart.Sub(checkStart)
		for _, p := range m.probes(churnProbes) {
			probes++
			if msg := p.run(n); msg != "" {
				fail("%s", msg)
			}
		}
		probeTime += time.Since(probeStart)
		t.Logf("batch %d: %d mutations, %s sync %v, check %v, requests %v", batch, size, kind,
			checkStart.Sub(syncStart).Round(time.Millisecond), probeStart.Sub(checkStart).Round(time.Millisecond), time.Since(probeStart).Round(time.Millisecond))
		batches++
		m.log = m.log[:0]
	}
	elapsed := time.Since(start)
	t.Logf("churn: time in syncs %v, reading back and comparing %v, requests %v",
		syncTime.Round(time.Millisecond), checkTime.Round(time.Millisecond), probeTime.Round(time.Millisecond))
	t.Logf("churn: %d mutations in %d batches (%d full syncs, %d restarts), %d failed syncs, checked in %v: %.1f mutations/s overall, %.0f mutations/s of sync time; %d requests; %d Services at the end",
		mutations, batches, fulls, restarts, failed, elapsed.Round(time.Millisecond), float64(mutations)/elapsed.Seconds(),
		float64(mutations)/syncTime.Seconds(), probes, len(m.svcs))
}

// Sizes of TestChurn.
const (
	churnPods         = 3
	churnMaxServices  = 24
	churnBatch        = 25 // mutations in a large batch, on average (ONEHOP_CHURN_BATCH)
	churnMinBatches   = 6
	churnFullEvery    = 3
	churnRestartEvery = 5
	churnProbes       = 3 // requests per batch
)
