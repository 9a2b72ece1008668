package soak

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
	"github.com/onehop/onehop/test/procstat"
)

// TestSoak: see the package comment.
func TestSoak(t *testing.T) {
	k, err := KnobsFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	// The churn, then the end-state checks and two agents' restarts.
	if d, ok := t.Deadline(); ok && time.Until(d) < k.Duration+3*time.Minute {
		t.Fatalf("go test's -timeout leaves %v; %s=%v needs 3 minutes more than that", time.Until(d).Round(time.Second), EnvDuration, k.Duration)
	}
	run := &Run{Knobs: k, Load: [2]string{procstat.LoadAvg()}}
	t.Logf("soak: %v at %.0f changes/s, a sample every %v, seed %d (%s=%d replays the changes)", k.Duration, k.Rate, k.Interval, k.Seed, EnvSeed, k.Seed)
	c := netns.NewForTest(t, netns.Config{Nodes: 2, PodsPerNode: 4})
	ctx, cancel := context.WithTimeout(context.Background(), k.Duration+30*time.Minute)
	defer cancel()

	// A client of its own: the churn writes faster than the cluster's
	// client's rate limit lets it.
	rc := c.CP.RESTConfig()
	rc.QPS, rc.Burst = 2000, 4000
	if c.Client, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	node := c.Nodes[0]
	run.Node = node.Name
	from := node.Pods[0]
	samplers := make([]*sampler, len(c.Nodes))
	for i, n := range c.Nodes {
		if samplers[i], err = newSampler(n); err != nil {
			t.Fatal(err)
		}
		defer samplers[i].Close()
	}
	s := samplers[0]

	targets, err := stableServices(ctx, c, from)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitServed(ctx, from, targets, c); err != nil {
		t.Fatal(err)
	}
	probe := startProber(ctx, from, targets)
	defer probe.Stop()
	churn := newChurn(c, k.Seed, k.Rate, from)
	churn.Start(ctx)
	defer churn.Stop()

	// Samples every interval while the churn runs.
	next := time.Now()
	for {
		smp, err := s.Take(ctx)
		if err != nil {
			t.Fatalf("sample at %v: %v", time.Since(churn.began).Round(time.Second), err)
		}
		smp.At, smp.Services, smp.Changes = time.Since(churn.began), churn.Services(), churn.changes.Load()
		run.Samples = append(run.Samples, smp)
		t.Logf("t=%v rss=%s MiB heap=%s MiB goroutines=%.0f fds=%d elements=%d conntrack=%d services=%d changes=%d load=%s",
			smp.At.Round(time.Second), mib(smp.RSS), mib(smp.Heap), smp.Goroutines, smp.FDs, smp.Elements, smp.Conntrack, smp.Services, smp.Changes, smp.Load)
		if err := churn.Err(); err != nil {
			t.Fatalf("churn: %v", err)
		}
		if smp.At >= k.Duration {
			break
		}
		next = next.Add(k.Interval)
		if end := churn.began.Add(k.Duration); next.After(end) {
			next = end // the last sample at the end, whatever the interval
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Until(next)):
		}
	}
	churn.Stop()
	if err := churn.Err(); err != nil {
		t.Fatalf("churn: %v", err)
	}
	run.Churn = churn.Summary()
	t.Log(run.Churn)

	// The end state: once the agents have taken in the last change, no
	// UDP flow may still be DNATed the way a change undid, and each
	// node's table must be the one a fresh agent makes of the same
	// Services.
	if err := serveMarker(ctx, c, from, c.Nodes[1].Pods[0]); err != nil {
		t.Fatalf("the Service written after the churn: %v", err)
	}
	for _, sm := range samplers {
		if err := waitQuiet(ctx, sm); err != nil {
			t.Fatal(err)
		}
	}
	checkConntrack(ctx, t, c, s, run)
	churned := make([]*Ruleset, len(c.Nodes))
	for i, sm := range samplers {
		if churned[i], err = sm.kernel.Read(true); err != nil {
			t.Fatal(err)
		}
	}
	// The stable Services are asked until here: the restarts below break
	// the nodes on purpose.
	var first []string
	run.Requests, run.Failed, first = probe.Stop()
	if run.Failed > 0 {
		t.Errorf("%d of %d requests to the stable Services failed; the first: %v", run.Failed, run.Requests, first)
	}
	for i, n := range c.Nodes {
		fresh := restartCold(ctx, t, c, n, samplers[i])
		diff := Diff(churned[i], fresh)
		run.Diffs += len(diff)
		if len(diff) > 0 {
			t.Errorf("%s: the table after the churn (%d elements, affinity sets' clients included) is not what a fresh agent makes of the same Services (%d); %d differences, the first: %v",
				n.Name, churned[i].Elements(), fresh.Elements(), len(diff), diff[:min(len(diff), 20)])
		} else {
			t.Logf("%s: the table after the churn is what a fresh agent makes of the same Services: %d chains, %d sets, %d elements",
				n.Name, len(fresh.Chains), len(fresh.Sets), fresh.Elements())
		}
	}

	run.Trends = FitTrends(run.Samples)
	for _, tr := range run.Trends {
		if tr.Leaks() {
			t.Errorf("the agent's %s grew over the second half beyond the leak rule's bound: %v", tr.Name, tr.Trend)
		}
	}
	run.Load[1] = procstat.LoadAvg()
	t.Log("\n" + run.Table())
	if k.Report != "" {
		if err := run.AppendTo(k.Report); err != nil {
			t.Error(err)
		}
	}
}

// checkConntrack fails t for every UDP flow on node 1 that is still
// DNATed the way a change undid.
func checkConntrack(ctx context.Context, t *testing.T, c *netns.Cluster, s *sampler, run *Run) {
	t.Helper()
	var addrs []netip.Addr
	for _, a := range []string{s.node.IP, s.node.IP6} {
		if ip, err := netip.ParseAddr(a); err == nil {
			addrs = append(addrs, ip)
		}
	}
	served, err := udpServed(ctx, c.Client, addrs)
	if err != nil {
		t.Fatal(err)
	}
	flows, err := s.ct.Flows()
	if err != nil {
		t.Fatal(err)
	}
	stale, checked := staleUDP(flows, served)
	run.UDPFlows, run.Stale = checked, len(stale)
	if len(stale) > 0 {
		t.Errorf("%s: %d of %d DNATed UDP conntrack entries are stale once the agent settled, e.g. %v", s.node.Name, len(stale), checked, stale[:min(len(stale), 10)])
	} else {
		t.Logf("%s: %d DNATed UDP conntrack entries, none stale", s.node.Name, checked)
	}
}

// restartCold replaces node n's agent with a fresh one on an empty table
// (SIGKILL, `agent cleanup`, start) and returns the table once it settled.
func restartCold(ctx context.Context, t *testing.T, c *netns.Cluster, n *netns.Node, s *sampler) *Ruleset {
	t.Helper()
	c.KillAgent(n)
	if out, err := nsutil.Exec(ctx, n.Netns, c.AgentArgs(n)[0], "cleanup"); err != nil {
		t.Fatalf("%s: agent cleanup: %v: %s", n.Name, err, out)
	}
	if err := c.StartAgent(ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := waitQuiet(ctx, s); err != nil {
		t.Fatal(err)
	}
	r, err := s.kernel.Read(true)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
