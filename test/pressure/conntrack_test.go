package pressure

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// conntrackHold is how long node 1's conntrack table stays full.
const conntrackHold = 30 * time.Second

// maxFill is the largest table the case fills (some 15 s and 80 MiB of
// kernel memory per 256Ki entries).
const maxFill = 1 << 20

// TestConntrackTableFull: node 1's conntrack table is filled to
// nf_conntrack_max with assured UDP flows on its loopback. (The kernel
// lets a network namespace other than the host's read nf_conntrack_max but
// not write it; the limit is the host's, the count the namespace's own, so
// the table is filled rather than shrunk.) While it is full, new
// connections from a pod on node 1 to a Service fail as the kernel decides
// (the case checks they do), an established one keeps working, and a
// Service is created. The agent must keep running without spinning (its
// CPU over the period, from /proc, stays under half a CPU) or flooding its
// log (at most a line every 2 s), and it says once that the table is
// nearly full; once the flows are gone both Services are served again.
func TestConntrackTableFull(t *testing.T) {
	c := newCluster(t, netns.Config{})
	n := c.Nodes[0]
	a := clusterAgent(n)
	ctx := ctxFor(t)
	client := n.Pods[0]
	backends := others(c, client)
	steady := expose(t, c, "steady", v1.ServiceTypeClusterIP, backends)
	waitServed(ctx, t, client.Netns, clusterIP(steady), backends, time.Now(), netns.ConvergeTimeout)
	conn, err := nsutil.DialEcho(ctx, client.Netns, clusterIP(steady))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Ask(ctx); err != nil {
		t.Fatal(err)
	}

	if _, limit, err := conntrackCount(n.Netns); err != nil {
		t.Fatal(err)
	} else if limit > maxFill {
		t.Skipf("this host's nf_conntrack_max is %d: more entries than the case fills (%d)", limit, maxFill)
	}
	flows, err := newUDPFlows(n.Netns)
	if err != nil {
		t.Fatal(err)
	}
	defer flows.Close()
	cpu0, log0, began := a.cpuTime(t), a.logSize(t), time.Now()
	count, limit, err := flows.fill(ctx)
	if err != nil {
		t.Fatal(err)
	}
	full := time.Now()
	t.Logf("%s's conntrack table: %d entries of %d (%d flows made in %v)", n.Name, count, limit, flows.made, full.Sub(began).Round(time.Millisecond))

	during := expose(t, c, "during", v1.ServiceTypeClusterIP, backends)
	var refused, answered, establishedFailed, asked int
	for time.Since(full) < conntrackHold {
		// Entries of other flows that time out would make room: filled again.
		if _, _, err := flows.fill(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := nsutil.Request(ctx, client.Netns, "tcp", clusterIP(steady)); err != nil {
			refused++
		} else {
			answered++
		}
		asked++
		if _, err := conn.Ask(ctx); err != nil {
			establishedFailed++
			t.Logf("established connection, request %d while the table is full: %v", asked, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := a.alive(); err != nil {
		t.Fatal(err)
	}
	cpu1, held := a.cpuTime(t), time.Now()
	lines := a.logSince(t, log0)
	if count, _, _ = conntrackCount(n.Netns); count < limit {
		t.Logf("%s's conntrack table: %d entries of %d at the end of the hold", n.Name, count, limit)
	}
	if err := flows.release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	after, _, _ := conntrackCount(n.Netns)
	t.Logf("flows deleted in %v: %d entries left", released.Sub(held).Round(time.Millisecond), after)

	t.Logf("while full: %d of %d new connections failed, %d answered; the established one failed %d times", refused, refused+answered, answered, establishedFailed)
	if refused == 0 {
		t.Fatalf("no new connection failed while the table was full: the case put no pressure")
	}
	if establishedFailed > 0 {
		t.Errorf("the established connection failed %d of %d times while the table was full", establishedFailed, asked)
	}
	period := held.Sub(began)
	cpu := cpu1 - cpu0
	t.Logf("agent CPU over the %v of pressure (filling included): %v, %.1f%% of a CPU", period.Round(time.Millisecond), cpu, 100*cpu.Seconds()/period.Seconds())
	if cpu > period/2 {
		t.Errorf("the agent used %v of CPU in %v of a full conntrack table: it spins", cpu, period.Round(time.Millisecond))
	}
	t.Logf("agent log over the pressure, %d lines:\n  %s", len(lines), strings.Join(lines, "\n  "))
	if max := 1 + int(period/(2*time.Second)); len(lines) > max {
		t.Errorf("the agent logged %d lines in %v of a full conntrack table (more than %d): it floods its log", len(lines), period.Round(time.Millisecond), max)
	}
	mentions := 0
	for _, l := range lines {
		if strings.Contains(strings.ToLower(l), "conntrack table") || strings.Contains(l, "nf_conntrack_count") {
			mentions++
		}
	}
	t.Logf("agent log lines that tell the table is full: %d", mentions)
	if mentions != 1 {
		t.Errorf("the agent told the full conntrack table %d times, want once", mentions)
	}

	for _, s := range []*v1.Service{steady, during} {
		d := waitServed(ctx, t, client.Netns, clusterIP(s), backends, released, netns.ConvergeTimeout)
		t.Logf("%s served %v after the flows were deleted", s.Name, d.Round(time.Millisecond))
	}
	// The metrics server, on the node's loopback, needs a conntrack entry
	// too: it is asked once the table has room again.
	m := a.metrics(t)
	t.Logf("agent metrics after: onehop_conntrack_entries %v, onehop_conntrack_max %v", m["onehop_conntrack_entries"], m["onehop_conntrack_max"])
	if m["onehop_conntrack_max"] != float64(limit) || m["onehop_conntrack_entries"] <= 0 {
		t.Errorf("onehop_conntrack_entries %v and onehop_conntrack_max %v, want some entries of %d", m["onehop_conntrack_entries"], m["onehop_conntrack_max"], limit)
	}
	if _, err := conn.Ask(ctx); err != nil {
		t.Errorf("the established connection after the pressure: %v", err)
	}
}
