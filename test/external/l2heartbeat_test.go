package external

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
)

var l2Kills = flag.Int("l2.kills", 20, "how many owners TestL2HeartbeatFailover kills, with the apiserver up, and again with it stopped before and after each kill")

// TestL2HeartbeatFailover: the L2 provider as deploy/ ships it, with the
// heartbeats' key and the default Lease timing (renew 1 s, duration 3 s),
// on three nodes, serving a dual-stack Service; a client asks who answers
// for both addresses every 50 ms. The agent of an address's owner is
// SIGKILLed at a random point of the heartbeat cycle, and the time from
// the kill to the first gratuitous announcement of the new owner the
// client hears is logged (p50, p95, max per family), -l2.kills times; then
// the agent starts again and takes its addresses back. The same again
// with kube-apiserver stopped (SIGSTOP) two seconds before each kill,
// past the moment the agents freeze their view of the Leases, and again
// with it stopped right after each kill, before the killed node's Lease
// expires: with Leases alone nothing would move in either. Each takeover
// must happen, and no request may get two answers except during the
// handover back to a restarted agent.
func TestL2HeartbeatFailover(t *testing.T) {
	const nodes = 3
	lab := newL2LabOf(t, nodes)
	lab.add("cp")
	lab.veth("sw", "vcp", "cp", "eth0")
	lab.ip("sw", "link", "set", "vcp", "master", "br0")
	lab.ip("cp", "addr", "add", "10.0.0.2/24", "dev", "eth0")
	cp, c := lab.startControlPlane("cp", "10.0.0.2")
	var names []string
	mac := map[string]string{}
	for i := 1; i <= nodes; i++ {
		n := fmt.Sprintf("node%d", i)
		names = append(names, n)
		createReadyNode(t, c, n, fmt.Sprintf("10.0.0.%d", 10+i))
		mac[n] = lab.mac(n, "eth0")
	}
	key := filepath.Join(t.TempDir(), "l2-heartbeat-key")
	if err := os.WriteFile(key, []byte("a key for the lab only, 32 bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip, vip6}}},
		L2:    &l2.Config{Interfaces: []string{"eth0"}, Heartbeat: &l2.HeartbeatConfig{KeyFile: key}},
	})
	t.Setenv("OHX_MODEL", "1") // the agents serve what their own model programs: both families
	sp.runController(cfg, "onehop-controller-0", "")
	agents := map[string]*exec.Cmd{}
	for _, n := range names {
		agents[n] = sp.startNodeAgent(lab, n, cfg)
	}
	createLB(t, c, "web", 80, func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	})
	if ips := lbIPs(t, c, "web", "allocation", func(ips []string) bool { return len(ips) == 2 }); !slices.Contains(ips, vip) || !slices.Contains(ips, vip6) {
		t.Fatalf("web got %v, want %s and %s", ips, vip, vip6)
	}
	eps, eps6 := map[string]string{}, map[string]string{}
	for i, n := range names {
		eps[n] = fmt.Sprintf("10.244.%d.2", i+1)
		eps6[n] = fmt.Sprintf("fd00:244:%d::2", i+1)
	}
	setEndpoints(t, c, "web", eps)
	putSlice(t, c, "web", "web-6", discoveryv1.AddressTypeIPv6, eps6)
	ips := []string{vip, vip6}
	owners := map[string]string{}
	for _, ip := range ips {
		owners[ip] = l2.Owner(netip4(ip), names)
	}
	probe := lab.startL2Prober("client", "eth0", ips...)
	// settle waits until every address is answered by its owner alone.
	settle := func(from time.Time, what string) time.Time {
		t.Helper()
		at := from
		for _, ip := range ips {
			first, ok := probe.waitAnswers(ip, from, 30*time.Second, mac[owners[ip]])
			if !ok {
				t.Fatalf("%s: %s never answered by its owner %s (%s) alone: %v", what, ip, owners[ip], mac[owners[ip]], probe.tail(ip, 5))
			}
			at = later(at, first)
		}
		return at
	}
	settled := settle(time.Now(), "start")

	type window struct {
		ip       string
		from, to time.Time
	}
	var allowed []window
	for _, phase := range []string{"apiserver up", "apiserver stopped before the kill", "apiserver stopped after the kill"} {
		garp := map[string][]time.Duration{} // family -> kill to first announcement
		alone := map[string][]time.Duration{}
		for i := range *l2Kills {
			x := owners[ips[i%2]]
			var others []string
			for _, n := range names {
				if n != x {
					others = append(others, n)
				}
			}
			var mine []string
			for _, ip := range ips {
				if owners[ip] == x {
					mine = append(mine, ip)
				}
			}
			var resume func()
			if phase == "apiserver stopped before the kill" {
				resume = hangAPIServer(t, cp)
				time.Sleep(2 * time.Second) // past half a lease duration: the agents' Lease view is frozen
			}
			// A random point of the heartbeat cycle (100 ms).
			time.Sleep(time.Duration(rand.IntN(100_000)) * time.Microsecond)
			tKill := time.Now()
			_ = agents[x].Process.Kill()
			if phase == "apiserver stopped after the kill" {
				resume = hangAPIServer(t, cp)
			}
			_ = agents[x].Wait()
			for _, ip := range mine {
				y := l2.Owner(netip4(ip), others)
				at, ok := probe.waitAnswers(ip, tKill, 15*time.Second, mac[y])
				if !ok {
					t.Fatalf("%s, kill %d: %s's agent killed, %s not taken over by %s (%s): %v", phase, i+1, x, ip, y, mac[y], probe.tail(ip, 5))
				}
				var g time.Time
				if _, ok := waitFor(t.Context(), 5*time.Second, func() bool { g, ok = probe.firstAnnouncement(ip, mac[y], tKill); return ok }); !ok {
					t.Fatalf("%s, kill %d: %s took %s over without an announcement the client heard", phase, i+1, y, ip)
				}
				family := "IPv4"
				if netip4(ip).Is6() {
					family = "IPv6"
				}
				garp[family] = append(garp[family], g.Sub(tKill))
				alone[family] = append(alone[family], at.Sub(tKill))
			}
			if resume != nil {
				resume()
			}
			tStart := time.Now()
			agents[x] = sp.startNodeAgent(lab, x, cfg)
			for _, ip := range mine {
				back, ok := probe.waitAnswerFrom(ip, tStart, 30*time.Second, mac[x])
				if !ok {
					t.Fatalf("%s, kill %d: %s's agent started again but never answered for %s: %v", phase, i+1, x, ip, probe.tail(ip, 5))
				}
				single, ok := probe.waitAnswers(ip, back.at, 15*time.Second, mac[x])
				if !ok {
					t.Fatalf("%s, kill %d: %s took %s back but another node still answers: %v", phase, i+1, x, ip, probe.tail(ip, 5))
				}
				allowed = append(allowed, window{ip, back.at, single})
			}
			settle(tStart, fmt.Sprintf("%s, kill %d", phase, i+1))
		}
		for _, family := range []string{"IPv4", "IPv6"} {
			t.Logf("%s, %s, %d kills of the owner (3 nodes, heartbeats 100 ms x 3): kill -> first gratuitous announcement %s; -> answered by the new owner alone %s",
				phase, family, len(garp[family]), percentiles(garp[family]), percentiles(alone[family]))
		}
	}
	// No double answer outside the handovers back to a restarted agent.
	for _, ip := range ips {
		for _, r := range probe.doubles(ip, settled, time.Now()) {
			if !slices.ContainsFunc(allowed, func(w window) bool { return w.ip == ip && !r.at.Before(w.from) && r.at.Before(w.to) }) {
				t.Errorf("two nodes answered one request outside a handover: %v", r)
			}
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// percentiles says p50, p95 and max of ds (nearest rank).
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(len(s)-1, i))]
	}
	return fmt.Sprintf("p50 %v, p95 %v, max %v (n=%d)", rank(0.5).Round(time.Millisecond), rank(0.95).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}

// TestL2LinkDownGivesIPsUp: the nodes reach the apiserver and each other
// on one network (eth1, their InternalIPs) and answer ARP and NDP on
// another (eth0, with the client). The owner's eth0 goes down: its agent
// still reaches the apiserver and the other node, yet it must give its
// addresses up, and the other node take them; when eth0 is up again the
// owner takes them back, and one node answers each request but during
// that handover. With the heartbeats the owner stops sending them; with
// the Leases alone it stops renewing its Lease.
func TestL2LinkDownGivesIPsUp(t *testing.T) {
	for _, beats := range []bool{true, false} {
		t.Run(map[bool]string{true: "heartbeats", false: "leases"}[beats], func(t *testing.T) {
			lab := newL2LabOf(t, 2)
			lab.ip("sw", "link", "add", "br1", "type", "bridge")
			lab.ip("sw", "link", "set", "br1", "up")
			lab.add("cp")
			for i, n := range []string{"cp", "node1", "node2"} {
				lab.veth("sw", "m"+n, n, "eth1")
				lab.ip("sw", "link", "set", "m"+n, "master", "br1")
				lab.ip(n, "addr", "add", fmt.Sprintf("10.1.0.%d/24", []int{2, 11, 12}[i]), "dev", "eth1")
			}
			cp, c := lab.startControlPlane("cp", "10.1.0.2")
			names := []string{"node1", "node2"}
			mac := map[string]string{}
			for i, n := range names {
				createReadyNode(t, c, n, fmt.Sprintf("10.1.0.%d", 11+i))
				mac[n] = lab.mac(n, "eth0")
			}
			l2c := &l2.Config{Interfaces: []string{"eth0"}}
			if beats {
				key := filepath.Join(t.TempDir(), "l2-heartbeat-key")
				if err := os.WriteFile(key, []byte("a key for the lab only, 32 bytes\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				l2c.Heartbeat = &l2.HeartbeatConfig{KeyFile: key}
			}
			sp := newSplit(t, cp)
			cfg := sp.config(config.Config{Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}}, L2: l2c})
			sp.runController(cfg, "onehop-controller-0", "")
			for _, n := range names {
				sp.startNodeAgent(lab, n, cfg)
			}
			createLB(t, c, "web", 80)
			if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
				t.Fatalf("web got %v, want %s", ips, vip)
			}
			setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
			owner := l2.Owner(netip4(vip), names)
			other := map[string]string{"node1": "node2", "node2": "node1"}[owner]
			probe := lab.startL2Prober("client", "eth0", vip)
			settled, ok := probe.waitAnswers(vip, time.Now(), 30*time.Second, mac[owner])
			if !ok {
				t.Fatalf("%s never answered by its owner %s alone: %v", vip, owner, probe.tail(vip, 5))
			}

			tDown := time.Now()
			lab.ip(owner, "link", "set", "eth0", "down")
			at, ok := probe.waitAnswers(vip, tDown, 20*time.Second, mac[other])
			if !ok {
				t.Fatalf("%s's eth0 down: %s not taken over by %s: %v", owner, vip, other, probe.tail(vip, 5))
			}
			t.Logf("%s's L2 link down: %s answered by %s alone after %v", owner, vip, other, at.Sub(tDown).Round(time.Millisecond))

			tUp := time.Now()
			lab.ip(owner, "link", "set", "eth0", "up")
			back, ok := probe.waitAnswerFrom(vip, tUp, 20*time.Second, mac[owner])
			if !ok {
				t.Fatalf("%s's eth0 up again: it never answered for %s: %v", owner, vip, probe.tail(vip, 5))
			}
			single, ok := probe.waitAnswers(vip, back.at, 20*time.Second, mac[owner])
			if !ok {
				t.Fatalf("%s took %s back but %s still answers beside it: %v", owner, vip, other, probe.tail(vip, 5))
			}
			t.Logf("%s's L2 link up again: %s answered by it alone after %v", owner, vip, single.Sub(tUp).Round(time.Millisecond))
			for _, r := range probe.doubles(vip, settled, time.Now()) {
				if r.at.Before(back.at) || !r.at.Before(single) {
					t.Errorf("two nodes answered one request outside the handover back: %v", r)
				}
			}
		})
	}
}
