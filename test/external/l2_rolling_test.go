package external

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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

// requestEvery is how often the rolling restart's client opens a new
// connection to each address.
const requestEvery = 20 * time.Millisecond

// TestL2RollingRestart: the L2 provider as deploy/ ships it, with the
// heartbeats' key, on two nodes serving a dual-stack Service with an
// endpoint on each node, once with externalTrafficPolicy Cluster and once
// Local. A client opens a new TCP connection to each address every 20 ms,
// and keeps one connection to the IPv4 address open, asking on it every
// 100 ms; another asks who answers for both addresses every 50 ms. Each
// node's agent is stopped (SIGTERM) and, once the other node answers for
// its addresses alone (a DaemonSet's pod does not start again at once),
// started again; the next one only a second after the last is ready (its
// Lease renewed, its addresses answered by it alone), twice over: a
// rolling update with maxUnavailable 1. A clean stop hands its addresses
// over without a probe for the stopping node (its last heartbeat said it
// leaves). No request may be answered by two nodes outside a handover,
// and no connection may fail but one open while its address moved (to a
// node without its conntrack entry, and back: it is reset), while the
// address's owner restarted. The counts and times are logged.
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

	type window struct {
		ip       string
		from, to time.Time
	}
	var allowed []window  // handovers: from a stopping agent, back to a restarted one
	var restarts []window // each agent's restart (ip: the node), from its SIGTERM until a while after it was ready
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
			// The DaemonSet's new pod starts a while after the old one
			// exited: the other node has taken the addresses over.
			for _, ip := range mine {
				y := other[x]
				at, ok := d.probe.waitAnswers(ip, tTerm, 15*time.Second, d.mac[y])
				if !ok {
					t.Fatalf("round %d: %s's agent stopped, %s not taken over by %s: %v", round, x, ip, y, d.probe.tail(ip, 5))
				}
				unanswered := 0
				for _, r := range d.probe.since(ip, tTerm) {
					if r.at.Before(at) && len(r.macs) == 0 {
						unanswered++
					}
				}
				// x said it stops (its last heartbeat, its Lease
				// deleted): y takes over without probing for x, whose
				// closing responder could answer the probe and hold
				// the address back for a Lease duration.
				if n := d.probe.probesBetween(ip, d.mac[y], tTerm, at); n > 0 {
					t.Errorf("round %d: %s's agent stopped cleanly, yet %s probed for %s %d times before taking it over", round, x, y, ip, n)
				}
				t.Logf("round %d: %s's agent stopped (SIGTERM) at +%v, %s answered by %s alone after %v, %d requests unanswered in between",
					round, x, tTerm.Sub(t0).Round(time.Millisecond), ip, y, at.Sub(tTerm).Round(time.Millisecond), unanswered)
				allowed = append(allowed, window{ip, tTerm.Add(-probeEvery), at}) // the request in flight at the SIGTERM too
			}
			tStart := time.Now()
			d.agents[x] = d.sp.startNodeAgent(d.lab, x, d.cfg)
			if _, ok := waitFor(t.Context(), 30*time.Second, func() bool { return renewedSince(d, x, tStart) }); !ok {
				t.Fatalf("round %d: %s's agent started again but never renewed its Lease", round, x)
			}
			ready := time.Now()
			for _, ip := range mine {
				back, ok := d.probe.waitAnswerFrom(ip, tStart, 30*time.Second, d.mac[x])
				if !ok {
					t.Fatalf("round %d: %s's agent started again but never answered for %s: %v", round, x, ip, d.probe.tail(ip, 5))
				}
				single, ok := d.probe.waitAnswers(ip, back.at, 15*time.Second, d.mac[x])
				if !ok {
					t.Fatalf("round %d: %s took %s back but another node still answers: %v", round, x, ip, d.probe.tail(ip, 5))
				}
				allowed = append(allowed, window{ip, back.at, single})
				ready = later(ready, single)
				t.Logf("round %d: %s's agent exited %v after SIGTERM; started again at +%v, it answered %s alone after %v",
					round, x, exited.Round(time.Millisecond), tStart.Sub(t0).Round(time.Millisecond), ip, single.Sub(tStart).Round(time.Millisecond))
			}
			// As a DaemonSet's minReadySeconds: the next agent stops a
			// while after this one is ready.
			time.Sleep(time.Second)
			restarts = append(restarts, window{x, tTerm, time.Now()})
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

	// A connection open while its address moves to another node breaks
	// (that node has no conntrack entry for it): a request may fail only
	// so, reset by the other node's pod while its address's owner
	// restarted. Any other failure (no answer to ARP or NS, a timeout,
	// a reset while the address stayed) fails the test.
	sent, failed, moved := map[string]int{}, map[string]int{}, map[string]int{}
	ipOf := map[string]string{addrs[0]: vip, addrs[1]: vip6}
	for _, r := range results {
		sent[r.addr]++
		if r.err == nil {
			continue
		}
		failed[r.addr]++
		if errors.Is(r.err, syscall.ECONNRESET) && slices.ContainsFunc(restarts, func(w window) bool {
			return w.ip == d.owners[ipOf[r.addr]] && r.end.After(w.from) && r.at.Before(w.to)
		}) {
			moved[r.addr]++
			continue
		}
		t.Errorf("request to %s at +%v failed, and not while its address moved: %v", r.addr, r.at.Sub(t0).Round(time.Millisecond), r.err)
	}
	for _, addr := range addrs {
		t.Logf("%s: %d new connections to %s during 4 agent restarts, %d failed, %d of them reset while the address moved (open while it did)", etp, sent[addr], addr, failed[addr], moved[addr])
	}
	// The open connection breaks when its address moves (no conntrack
	// entry on the other node), so only while its owner restarts.
	for _, f := range longFails {
		if !slices.ContainsFunc(restarts, func(w window) bool {
			return w.ip == d.owners[vip] && !f.at.Before(w.from) && f.at.Before(w.to)
		}) {
			t.Errorf("the open connection to %s failed at +%v, while %s's agent did not restart: %v", addrs[0], f.at.Sub(t0).Round(time.Millisecond), d.owners[vip], f.err)
		}
	}
	t.Logf("%s: the open connection to %s asked %d times, failed %d times (%s's agent, its owner, restarted twice)", etp, addrs[0], longAsked, len(longFails), d.owners[vip])
	doubles := 0
	for _, ip := range []string{vip, vip6} {
		for _, r := range d.probe.doubles(ip, d.settled, time.Now()) {
			doubles++
			if !slices.ContainsFunc(allowed, func(w window) bool { return w.ip == ip && !r.at.Before(w.from) && r.at.Before(w.to) }) {
				t.Errorf("two nodes answered one request outside a handover: %v", r)
			}
		}
	}
	var hand []string
	for _, w := range allowed {
		hand = append(hand, fmt.Sprintf("%s %v", w.ip, w.to.Sub(w.from).Round(time.Millisecond)))
	}
	t.Logf("%s: %d ARP/NS requests per address, %d answered twice, all within the handovers (%v)", etp, len(d.probe.since(vip, d.settled)), doubles, hand)
}

// renewedSince says whether node's liveness Lease was renewed at or after t.
func renewedSince(d *dualStackL2, node string, t time.Time) bool {
	l, err := d.c.CoordinationV1().Leases(splitLeaseNamespace).Get(context.Background(), "onehop-l2-"+node, metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil {
		return false
	}
	return !l.Spec.RenewTime.Time.Before(t.Truncate(time.Microsecond))
}

// probesBetween counts the ARP probes for ip by mac heard in [from, to]
// (IPv4 only: the prober does not hear neighbour solicitations).
func (p *l2Prober) probesBetween(ip, mac string, from, to time.Time) int {
	a := netip.MustParseAddr(ip)
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, x := range p.probes {
		if x.ip == a && x.mac == mac && !x.at.Before(from) && !x.at.After(to) {
			n++
		}
	}
	return n
}
