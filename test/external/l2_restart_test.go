package external

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
)

// announceRounds is how many times a new owner announces an IP.
const announceRounds = 5

// TestL2OneOwnerAfterRestart: the L2 provider as deploy/ ships it on two
// nodes, a dual-stack Service with an address of each family, and a client
// that asks who answers for both every 50 ms (broadcast ARP request,
// neighbour solicitation). The agent of each address's owner is SIGKILLed
// and the other node takes the address over once the owner's Lease
// expires, announcing it in a burst; then the killed agent starts again, its Lease renews, and it
// takes its addresses back. From then on one node alone may answer: the
// survivor must stop within a handover, never answer beside the owner
// afterwards, and no request may get two answers at any other moment of
// the test. The times measured (kill -> takeover, restart -> one owner)
// are logged.
func TestL2OneOwnerAfterRestart(t *testing.T) {
	d := startDualStackL2(t)
	lab, sp, cfg, agents, mac, owners, probe, settled := d.lab, d.sp, d.cfg, d.agents, d.mac, d.owners, d.probe, d.settled
	other := map[string]string{"node1": "node2", "node2": "node1"}
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	hostPort := map[string]string{vip: vip + ":80", vip6: "[" + vip6 + "]:80"}
	for ip, owner := range owners {
		if got, err := lab.get("client", hostPort[ip]); err != nil || got != pod[owner] {
			t.Fatalf("client -> %s: %q, %v; want %s", hostPort[ip], got, err, pod[owner])
		}
	}

	// allowed are the handovers: from an owner's first answer after its
	// restart until it answered alone.
	type window struct {
		ip       string
		from, to time.Time
	}
	var allowed []window
	var killed []string // each owner once
	for _, ip := range []string{vip, vip6} {
		if !slices.Contains(killed, owners[ip]) {
			killed = append(killed, owners[ip])
		}
	}
	for _, x := range killed {
		y := other[x]
		var mine []string
		for ip, owner := range owners {
			if owner == x {
				mine = append(mine, ip)
			}
		}
		slices.Sort(mine)

		tKill := time.Now()
		_ = agents[x].Process.Kill()
		for _, ip := range mine {
			at, ok := probe.waitAnswers(ip, tKill, 15*time.Second, mac[y])
			if !ok {
				t.Fatalf("%s's agent killed: %s not taken over by %s (%s): %v", x, ip, y, mac[y], probe.tail(ip, 5))
			}
			t.Logf("%s's agent SIGKILLed: %s answered by %s alone after %v (Lease 1.5 s)", x, ip, y, at.Sub(tKill).Round(time.Millisecond))
			// The new owner announces itself in a burst of 5 rounds,
			// each in both ARP forms (or as an unsolicited advertisement).
			want := map[string]int{"request": announceRounds, "reply": announceRounds}
			if netip4(ip).Is6() {
				want = map[string]int{"na": announceRounds}
			}
			if got, ok := probe.waitAnnouncements(ip, mac[y], tKill, 15*time.Second, want); !ok {
				t.Errorf("%s took %s over with the announcements %v, want at least %v", y, ip, got, want)
			}
		}

		tStart := time.Now()
		agents[x] = sp.startNodeAgent(lab, x, cfg)
		for _, ip := range mine {
			back, ok := probe.waitAnswerFrom(ip, tStart, 30*time.Second, mac[x])
			if !ok {
				t.Fatalf("%s's agent started again but never answered for %s: %v", x, ip, probe.tail(ip, 5))
			}
			// The handover: the survivor must stop answering soon after
			// the owner answers again. The bound is generous (many Lease
			// durations); a survivor that never stops fails it.
			single, ok := probe.waitAnswers(ip, back.at, 10*time.Second, mac[x])
			if !ok {
				t.Fatalf("%s's agent took %s back but %s (%s) still answers beside it: %v", x, ip, y, mac[y], probe.tail(ip, 5))
			}
			allowed = append(allowed, window{ip, back.at, single})
			t.Logf("%s's agent started again: %s answered by it after %v, by it alone after %v (%d requests answered twice in between)",
				x, ip, back.at.Sub(tStart).Round(time.Millisecond), single.Sub(tStart).Round(time.Millisecond), len(probe.doubles(ip, back.at, single)))
		}
		// Past the handover, one owner, for many rounds (a round the
		// owner's answer missed, on a busy machine, says nothing).
		steady := time.Now()
		time.Sleep(3 * time.Second)
		for _, ip := range mine {
			for _, r := range probe.since(ip, steady) {
				if slices.ContainsFunc(r.macs, func(m string) bool { return m != mac[x] }) {
					t.Fatalf("after the handover of %s back to %s (%s): %v", ip, x, mac[x], r)
				}
			}
		}
	}
	// No double answer outside the handovers checked above: while the
	// owners were killed, and for the addresses that did not move.
	for _, ip := range []string{vip, vip6} {
		for _, r := range probe.doubles(ip, settled, time.Now()) {
			if !slices.ContainsFunc(allowed, func(w window) bool { return w.ip == ip && !r.at.Before(w.from) && r.at.Before(w.to) }) {
				t.Errorf("two nodes answered one request outside a handover: %v", r)
			}
		}
	}
	for ip, owner := range owners {
		if got, err := lab.get("client", hostPort[ip]); err != nil || got != pod[owner] {
			t.Errorf("at the end client -> %s: %q, %v; want %s", hostPort[ip], got, err, pod[owner])
		}
	}
}

// dualStackL2 is the L2 provider as deploy/ ships it on node1 and node2,
// serving a dual-stack Service "web" (vip, vip6), with a client asking
// who answers for both every 50 ms since settled, when each address was
// answered by its owner alone.
type dualStackL2 struct {
	lab     *topo
	c       kubernetes.Interface
	sp      *split
	cfg     config.Config
	agents  map[string]*exec.Cmd
	mac     map[string]string // node -> its eth0's link-layer address
	owners  map[string]string // address -> l2.Owner over both nodes
	probe   *l2Prober
	settled time.Time
}

func startDualStackL2(t *testing.T) *dualStackL2 { return startDualStackL2With(t, nil) }

// startDualStackL2With is startDualStackL2 with l2's configuration (Lease
// 0.5 s / 1.5 s) changed by tune (nil: as it is), and the Service by opts.
func startDualStackL2With(t *testing.T, tune func(*l2.Config), opts ...svcOpt) *dualStackL2 {
	t.Helper()
	lab := newL2Lab(t)
	cp, c := lab.twoNodeCluster("sw")
	sp := newSplit(t, cp)
	l2c := &l2.Config{Interfaces: []string{"eth0"}, LeaseRenewSeconds: 0.5, LeaseDurationSeconds: 1.5}
	if tune != nil {
		tune(l2c)
	}
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip, vip6}}},
		L2:    l2c,
	})
	t.Setenv("OHX_MODEL", "1") // the agents serve what their own model programs: both families
	sp.runController(cfg, "onehop-controller-0", "")
	d := &dualStackL2{lab: lab, c: c, sp: sp, cfg: cfg, agents: map[string]*exec.Cmd{}, owners: map[string]string{},
		mac: map[string]string{"node1": lab.mac("node1", "eth0"), "node2": lab.mac("node2", "eth0")}}
	for _, n := range []string{"node1", "node2"} {
		d.agents[n] = sp.startNodeAgent(lab, n, cfg)
	}
	createLB(t, c, "web", 80, append([]svcOpt{func(s *corev1.Service) {
		s.Spec.IPFamilyPolicy = new(corev1.IPFamilyPolicyRequireDualStack)
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}}, opts...)...)
	if ips := lbIPs(t, c, "web", "allocation", func(ips []string) bool { return len(ips) == 2 }); !slices.Contains(ips, vip) || !slices.Contains(ips, vip6) {
		t.Fatalf("web got %v, want %s and %s", ips, vip, vip6)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	putSlice(t, c, "web", "web-6", discoveryv1.AddressTypeIPv6, map[string]string{"node1": "fd00:244:1::2", "node2": "fd00:244:2::2"})
	for _, ip := range []string{vip, vip6} {
		d.owners[ip] = l2.Owner(netip4(ip), []string{"node1", "node2"})
	}
	d.probe = lab.startL2Prober("client", "eth0", vip, vip6)
	// Starting agents may each claim an address until they have seen the
	// other's Lease: the test judges from a settled state on.
	d.settled = time.Now()
	for ip, owner := range d.owners {
		if at, ok := d.probe.waitAnswers(ip, d.settled, 30*time.Second, d.mac[owner]); !ok {
			t.Fatalf("%s never settled on its owner %s (%s): %v", ip, owner, d.mac[owner], d.probe.tail(ip, 5))
		} else if at.After(d.settled) {
			d.settled = at
		}
	}
	return d
}

// TestL2FlappingOwner: the agent of vip's owner is SIGKILLed and started
// again over and over, every half and every twice the detection time (the
// Lease duration; with heartbeats, 3 missed), while a client asks who
// answers for both addresses every 50 ms. A request may be answered twice
// only during a handover: within a Lease duration of the agent's start. At
// the end the owner answers alone.
func TestL2FlappingOwner(t *testing.T) {
	t.Run("leases", func(t *testing.T) { flappingOwner(t, startDualStackL2(t), 1500*time.Millisecond) })
	t.Run("heartbeats", func(t *testing.T) {
		key := filepath.Join(t.TempDir(), "l2-heartbeat-key")
		if err := os.WriteFile(key, []byte("a key for the lab only, 32 bytes\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		d := startDualStackL2With(t, func(c *l2.Config) { c.Heartbeat = &l2.HeartbeatConfig{KeyFile: key} })
		flappingOwner(t, d, 300*time.Millisecond)
	})
}

func flappingOwner(t *testing.T, d *dualStackL2, detection time.Duration) {
	const lease = 1500 * time.Millisecond
	x := d.owners[vip]
	var starts []time.Time
	cycles := 0
	for _, every := range []time.Duration{detection / 2, 2 * detection} {
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); cycles++ {
			_ = d.agents[x].Process.Kill()
			time.Sleep(every)
			starts = append(starts, time.Now())
			d.agents[x] = d.sp.startNodeAgent(d.lab, x, d.cfg)
			time.Sleep(every)
		}
	}
	for ip, owner := range d.owners {
		if _, ok := d.probe.waitAnswers(ip, starts[len(starts)-1], 20*time.Second, d.mac[owner]); !ok {
			t.Fatalf("after %d restarts of %s's agent %s is not answered by its owner %s alone: %v", cycles, x, ip, owner, d.probe.tail(ip, 5))
		}
	}
	doubles := 0
	for _, ip := range []string{vip, vip6} {
		for _, r := range d.probe.doubles(ip, d.settled, time.Now()) {
			doubles++
			if !slices.ContainsFunc(starts, func(s time.Time) bool { return !r.at.Before(s) && r.at.Before(s.Add(lease)) }) {
				t.Errorf("two nodes answered one request outside a handover: %v", r)
			}
		}
	}
	t.Logf("%d kills and restarts of %s's agent, every %v and %v; %d rounds for each address; %d of them answered twice, each within a Lease duration of a restart",
		cycles, x, detection/2, 2*detection, len(d.probe.since(vip, d.settled)), doubles)
}

// TestL2PartitionOneOwnerEach: the owner of vip is cut off from the
// apiserver (a blackhole route to it in its namespace) while the segment
// stays whole; the other node owns vip6. For four Lease durations the
// other node sees vip's owner's Lease expire, probes before a takeover,
// hears it answering and leaves vip to it, again each Lease duration:
// each address stays answered by its owner alone, and the other node
// does not announce its own address again each time it hears the owner
// anew (at most one burst).
func TestL2PartitionOneOwnerEach(t *testing.T) {
	d := startDualStackL2(t)
	x, y := d.owners[vip], d.owners[vip6]
	if x == y {
		t.Fatalf("both addresses are owned by %s: the test needs one owner each", x)
	}
	time.Sleep(6 * time.Second) // past the start-up bursts
	t0 := time.Now()
	d.lab.ip(x, "route", "add", "blackhole", "10.0.0.2/32")
	time.Sleep(6 * time.Second)
	t1 := time.Now()
	d.lab.ip(x, "route", "del", "blackhole", "10.0.0.2/32")
	for ip, owner := range d.owners {
		rounds := d.probe.since(ip, t0)
		for _, r := range rounds {
			if slices.ContainsFunc(r.macs, func(m string) bool { return m != d.mac[owner] }) {
				t.Errorf("while %s was cut off from the apiserver, a request for %s was answered by %v, want its owner %s (%s) alone", x, ip, r, owner, d.mac[owner])
			}
		}
		t.Logf("%s: %d requests while %s was cut off and after, answered by %s alone", ip, len(rounds), x, owner)
	}
	var again int
	for _, n := range d.probe.announcements(vip6, d.mac[y], t0) {
		again += n
	}
	if again > announceRounds {
		t.Errorf("%s announced %s %d times while %s was cut off from the apiserver for 6 s, want one burst at most", y, vip6, again, x)
	}
	t.Logf("%s announced %s %d times while %s was cut off (%v)", y, vip6, again, x, t1.Sub(t0).Round(time.Millisecond))
}
