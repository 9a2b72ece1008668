package external

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/test/nsutil"
)

// restartGap is how long after its SIGTERM a restarted agent starts
// again: a DaemonSet's new pod, its image already on the node.
const restartGap = 2 * time.Second

// requestEvery is how often the rolling restart's client opens a new
// connection to each address.
const requestEvery = 20 * time.Millisecond

// TestL2RollingRestart: the L2 provider as deploy/ ships it, with the
// heartbeats' key, on two nodes serving a dual-stack Service with an
// endpoint on each node, once with externalTrafficPolicy Cluster and once
// Local. A client opens a new TCP connection to each address every 20 ms,
// and keeps one connection to the IPv4 address open, asking on it every
// 100 ms; another asks who answers for both addresses every 50 ms. Each
// node's agent is stopped (SIGTERM) and started again restartGap later
// (a DaemonSet's new pod starts a while after the old one exited), the
// next one only a second after the last is ready (its Lease renewed, its
// addresses answered by it), twice over: a rolling update with
// maxUnavailable 1. A stopping agent whose Node stays says it restarts:
// the other node holds its addresses back, and its kernel forwards
// meanwhile (nobody answers ARP or NS, and the client's neighbour entries,
// confirmed by its connections, hold). So the addresses never move: the
// other node never answers for them, no request is answered twice, and no
// request and no open connection fails. The counts and times are logged.
func TestL2RollingRestart(t *testing.T) {
	for _, etp := range []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal} {
		t.Run(string(etp), func(t *testing.T) { rollingRestart(t, etp) })
	}
}

// clientResult is one request of the client's loop.
type clientResult struct {
	at, end time.Time
	addr    string
	err     error
}

func rollingRestart(t *testing.T, etp corev1.ServiceExternalTrafficPolicy) {
	key := filepath.Join(t.TempDir(), "l2-heartbeat-key")
	if err := os.WriteFile(key, []byte("a key for the lab only, 32 bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDualStackL2With(t, func(c *l2.Config) { c.Heartbeat = &l2.HeartbeatConfig{KeyFile: key} },
		func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = etp })
	addrs := []string{vip + ":80", "[" + vip6 + "]:80"}

	// Served before the clients start: an address may be answered for a
	// moment before its node's rules are in.
	for _, addr := range addrs {
		if _, ok := waitFor(t.Context(), 30*time.Second, func() bool {
			_, err := d.lab.at("client").Ask("tcp", addr, time.Second)
			return err == nil
		}); !ok {
			t.Fatalf("%s never served", addr)
		}
	}

	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var results []clientResult
	var longFails []clientResult
	longAsked := 0
	for _, addr := range addrs {
		wg.Go(func() {
			tick := time.NewTicker(requestEvery)
			defer tick.Stop()
			for ctx.Err() == nil {
				at := time.Now()
				_, err := d.lab.at("client").Ask("tcp", addr, 2*time.Second)
				mu.Lock()
				results = append(results, clientResult{at, time.Now(), addr, err})
				mu.Unlock()
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
		})
	}
	wg.Go(func() {
		var conn *nsutil.EchoConn
		defer func() {
			if conn != nil {
				_ = conn.Close()
			}
		}()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			at := time.Now()
			var err error
			if conn == nil {
				conn, err = nsutil.DialEcho(ctx, d.lab.name("client"), addrs[0])
			}
			if err == nil {
				_, err = conn.Ask(ctx)
			}
			mu.Lock()
			longAsked++
			if err != nil && ctx.Err() == nil {
				longFails = append(longFails, clientResult{at, time.Now(), addrs[0], err})
			}
			mu.Unlock()
			if err != nil && conn != nil {
				_ = conn.Close()
				conn = nil
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	})
	stopClients := sync.OnceFunc(func() { stop(); wg.Wait() })
	t.Cleanup(stopClients)

	other := map[string]string{"node1": "node2", "node2": "node1"}
	t0 := time.Now()
	for round := 1; round <= 2; round++ {
		for _, x := range []string{"node1", "node2"} {
			var mine []string
			for ip, owner := range d.owners {
				if owner == x {
					mine = append(mine, ip)
				}
			}
			slices.Sort(mine)
			tTerm := time.Now()
			_ = d.agents[x].Process.Signal(syscall.SIGTERM)
			if err := d.agents[x].Wait(); err != nil {
				t.Errorf("round %d: %s's agent exit after SIGTERM: %v", round, x, err)
			}
			exited := time.Since(tTerm)
			time.Sleep(restartGap - exited)
			tStart := time.Now()
			d.agents[x] = d.sp.startNodeAgent(d.lab, x, d.cfg)
			if _, ok := waitFor(t.Context(), 30*time.Second, func() bool { return renewedSince(d, x, tStart) }); !ok {
				t.Fatalf("round %d: %s's agent started again but never renewed its Lease", round, x)
			}
			for _, ip := range mine {
				back, ok := d.probe.waitAnswerFrom(ip, tStart, 30*time.Second, d.mac[x])
				if !ok {
					t.Fatalf("round %d: %s's agent started again but never answered for %s: %v", round, x, ip, d.probe.tail(ip, 5))
				}
				unanswered := 0
				for _, r := range d.probe.since(ip, tTerm) {
					if r.at.Before(back.at) && len(r.macs) == 0 {
						unanswered++
					}
					if slices.Contains(r.macs, d.mac[other[x]]) {
						t.Errorf("round %d: %s's agent restarting, %s answered for %s: %v", round, x, other[x], ip, r)
					}
				}
				t.Logf("round %d: %s's agent exited %v after SIGTERM, started again %v after it; it answered %s again %v after its start (%d ARP/NS requests unanswered meanwhile, none by %s)",
					round, x, exited.Round(time.Millisecond), restartGap, ip, back.at.Sub(tStart).Round(time.Millisecond), unanswered, other[x])
			}
			// As a DaemonSet's minReadySeconds: the next agent stops a
			// while after this one is ready.
			time.Sleep(time.Second)
		}
	}
	// Each agent's heartbeat metrics: the other node alive, its
	// heartbeats taken, none refused for a wrong key or address.
	for _, n := range []string{"node1", "node2"} {
		if _, ok := waitFor(t.Context(), 10*time.Second, func() bool {
			return d.sp.nodeMetric(t, n, `onehop_l2_heartbeat_peers{state="alive"}`) == "1"
		}); !ok {
			t.Errorf("%s: onehop_l2_heartbeat_peers{state=\"alive\"} %q, want 1", n, d.sp.nodeMetric(t, n, `onehop_l2_heartbeat_peers{state="alive"}`))
		}
		got := map[string]string{}
		for _, s := range []string{"onehop_l2_heartbeats_received_total", `onehop_l2_heartbeats_refused_total{reason="bad_mac"}`, `onehop_l2_heartbeats_refused_total{reason="wrong_source"}`} {
			got[s] = d.sp.nodeMetric(t, n, s)
		}
		if got["onehop_l2_heartbeats_received_total"] == "0" || got["onehop_l2_heartbeats_received_total"] == "" ||
			got[`onehop_l2_heartbeats_refused_total{reason="bad_mac"}`] != "0" {
			t.Errorf("%s's heartbeat metrics %v: want heartbeats taken, none refused for another key", n, got)
		}
		t.Logf("%s's heartbeat metrics: %v", n, got)
	}
	stopClients()

	// The addresses never moved: not one request may fail.
	sent, failed := map[string]int{}, map[string]int{}
	for _, r := range results {
		sent[r.addr]++
		if r.err != nil {
			failed[r.addr]++
			t.Errorf("request to %s at +%v failed: %v", r.addr, r.at.Sub(t0).Round(time.Millisecond), r.err)
		}
	}
	for _, addr := range addrs {
		t.Logf("%s: %d new connections to %s during 4 agent restarts, %d failed", etp, sent[addr], addr, failed[addr])
	}
	for _, f := range longFails {
		t.Errorf("the open connection to %s failed at +%v: %v", addrs[0], f.at.Sub(t0).Round(time.Millisecond), f.err)
	}
	t.Logf("%s: the open connection to %s asked %d times, failed %d times (%s's agent, its owner, restarted twice)", etp, addrs[0], longAsked, len(longFails), d.owners[vip])
	doubles := 0
	for _, ip := range []string{vip, vip6} {
		for _, r := range d.probe.doubles(ip, d.settled, time.Now()) {
			doubles++
			t.Errorf("two nodes answered one request: %v", r)
		}
	}
	t.Logf("%s: %d ARP/NS requests per address, %d answered twice", etp, len(d.probe.since(vip, d.settled)), doubles)
}

// renewedSince says whether node's liveness Lease was renewed at or after t.
func renewedSince(d *dualStackL2, node string, t time.Time) bool {
	l, err := d.c.CoordinationV1().Leases(splitLeaseNamespace).Get(context.Background(), "onehop-l2-"+node, metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil {
		return false
	}
	return !l.Spec.RenewTime.Time.Before(t.Truncate(time.Microsecond))
}
