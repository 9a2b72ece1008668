package external

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/config"
)

// TestBGPGracefulRestartKeepsRoute: an externalTrafficPolicy Local Service
// served from node1 alone, through BIRD with graceful restart on, while a
// client asks for it every 20 ms. node1's agent, with graceful restart on
// its peer, is killed (SIGKILL) and started again, then stopped (SIGTERM,
// a rolling update) and started again: BIRD keeps the route as stale each
// time ("Neighbor graceful restart active", its restart timer running),
// the router's kernel route to the Service never changes, the agent back
// ends the restart with End-of-RIB, and not one request fails. The stopped
// agent closed the session without a NOTIFICATION.
func TestBGPGracefulRestartKeepsRoute(t *testing.T) {
	r := startRestartLab(t, true, false)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		r.restart(t, sig, nil)
	}
	r.checkUnbroken(t)
}

// TestBGPGracefulRestartWithBFD: the same with BFD on the session, and
// BIRD told to take a BFD failure for a restart (`bfd graceful`): the
// killed agent's BFD session goes down too, and BIRD keeps the route.
func TestBGPGracefulRestartWithBFD(t *testing.T) {
	r := startRestartLab(t, true, true)
	r.restart(t, syscall.SIGKILL, func(proto string) bool { return strings.Contains(proto, "BFD session down") })
	r.checkUnbroken(t)
}

// restart stops node1's agent with sig and starts it again once BIRD is
// in graceful restart (and, with also, once also holds of its view of the
// session); BIRD must keep the route meanwhile and end the restart once
// the agent is back.
func (r *restartLab) restart(t *testing.T, sig syscall.Signal, also func(proto string) bool) {
	t.Helper()
	t0 := time.Now()
	r.stopAgent(sig)
	d := r.waitBird(t, sig.String()+": BIRD keeps node1's routes as stale", func(proto string) bool {
		return strings.Contains(proto, "Neighbor graceful restart active") && strings.Contains(proto, "Restart timer:") &&
			(also == nil || also(proto))
	})
	t.Logf("%v: BIRD in graceful restart %v after the signal", sig, d.Round(time.Millisecond))
	if route := r.lab.birdc("show", "route", "for", vip); !strings.Contains(route, "10.0.0.11") {
		t.Fatalf("%v: BIRD dropped the route during the restart:\n%s", sig, route)
	}
	if proto := r.lab.birdc("show", "protocols", "all", "node1"); strings.Contains(proto, "Received:") {
		t.Errorf("%v: the agent sent a NOTIFICATION:\n%s", sig, proto)
	}
	r.startAgent()
	r.waitBird(t, sig.String()+": node1's agent back ends the restart", func(proto string) bool {
		return strings.Contains(proto, "Established") && !strings.Contains(proto, "graceful restart active")
	})
	t.Logf("%v: session up again and graceful restart over (End-of-RIB) %v after the signal", sig, time.Since(t0).Round(time.Millisecond))
	r.checkCapability(t)
	time.Sleep(time.Second) // traffic after the restart, too
}

// checkUnbroken ends the requests and fails the test unless all were
// answered and the router's kernel route to the Service never changed.
func (r *restartLab) checkUnbroken(t *testing.T) {
	t.Helper()
	ok, failed, hops := r.stop()
	t.Logf("%d requests, %d failed; router's next hops for %s over the test: %v", ok+len(failed), len(failed), vip, hops)
	if len(failed) > 0 {
		t.Errorf("%d requests failed across the agent's restarts: %v", len(failed), failed)
	}
	if !slices.EqualFunc(hops, [][]string{{"10.0.0.11"}}, slices.Equal) {
		t.Errorf("the router's next hops for %s changed: %v, want [10.0.0.11] throughout", vip, hops)
	}
	if changes := r.routeChanges(); len(changes) > 0 {
		t.Errorf("the router's kernel route to %s changed across the restarts:\n%s", vip, strings.Join(changes, "\n"))
	}
}

// TestBGPWithoutGracefulRestartWithdraws is the same without graceful
// restart on the agent's peer (BIRD's is on): the killed agent's session
// ends, BIRD withdraws node1's route at once, the Service is dark and
// requests fail until the agent is back.
func TestBGPWithoutGracefulRestartWithdraws(t *testing.T) {
	r := startRestartLab(t, false, false)
	time.Sleep(500 * time.Millisecond) // requests answered before
	t0 := time.Now()
	r.stopAgent(syscall.SIGKILL)
	d := r.lab.waitHops(t, "node1's agent killed")
	t.Logf("without graceful restart: node1's route withdrawn from the router's kernel %v after SIGKILL", d.Round(time.Millisecond))
	if proto := r.lab.birdc("show", "protocols", "all", "node1"); strings.Contains(proto, "graceful restart active") {
		t.Errorf("BIRD is in graceful restart with a peer that did not advertise it:\n%s", proto)
	}
	time.Sleep(500 * time.Millisecond) // requests while dark
	r.startAgent()
	r.lab.waitHops(t, "node1's agent back", "10.0.0.11")
	t.Logf("route back %v after SIGKILL", time.Since(t0).Round(time.Millisecond))
	ok, failed, hops := r.stop()
	t.Logf("%d requests, %d failed; router's next hops for %s over the test: %v", ok+len(failed), len(failed), vip, hops)
	if len(failed) == 0 || ok == 0 {
		t.Errorf("%d requests answered, %d failed: want some answered before the kill and some failed after", ok, len(failed))
	}
	if !slices.EqualFunc(hops, [][]string{{"10.0.0.11"}, nil, {"10.0.0.11"}}, slices.Equal) {
		t.Errorf("the router's next hops for %s: %v, want node1, none, node1", vip, hops)
	}
	if changes := r.routeChanges(); len(changes) == 0 || !strings.HasPrefix(changes[0], "Deleted") {
		t.Errorf("the router's kernel route changes: %q, want its deletion first", changes)
	}
}

// restartLab is a split install on the BGP lab, BIRD with graceful restart
// on (and BFD, taking its failures for restarts, when asked), an externalTrafficPolicy Local Service whose one endpoint is on
// node1, node1's agent as a process of its own, and a client asking for
// the Service every 20 ms.
type restartLab struct {
	t     *testing.T
	lab   *bgpLab
	sp    *split
	cfg   config.Config
	agent *exec.Cmd

	done    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	ok      int
	failed  []string
	endHops func() [][]string
	// routeLog is every change of the router's kernel routes.
	routeLog *lockedBuffer
}

func startRestartLab(t *testing.T, graceful, bfd bool) *restartLab {
	lab := newBGPLabBFD(t, bfd)
	lab.reconfigure(t, [][2]string{{"bfd " + map[bool]string{false: "off", true: "on"}[bfd] + ";",
		"bfd " + map[bool]string{false: "off", true: "graceful"}[bfd] + "; graceful restart on;"}}, "")
	// node1 serves the Service with the real nft dataplane its agent
	// programs, from what its model makes of the cluster, and reports
	// once programmed: not the lab's stand-in rule. Its rules stay in the
	// kernel when the agent stops, as `agent run`'s do.
	lab.exec("node1", "nft", "delete", "table", "inet", "ohxtest")
	t.Setenv("OHX_MODEL", "1")
	t.Setenv("OHX_NFT", "1")
	// Its first sync is slower than a session coming up: the restarted
	// speaker's End-of-RIB must wait for it, or the router drops the
	// stale route the agent does not announce yet.
	t.Setenv("OHX_FIRST_SYNC_AFTER", "3s")
	cp, c := lab.twoNodeCluster("router")
	sp := newSplit(t, cp)
	r := &restartLab{t: t, lab: lab, sp: sp, done: make(chan struct{})}
	r.cfg = sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}},
		BGP: &bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9,
			GracefulRestart: graceful, BFD: bfd}}},
	})
	sp.runController(r.cfg, "onehop-controller-0", "")
	r.startAgent()
	sp.startNodeAgent(lab.topo, "node2", r.cfg)
	createLB(t, c, "web", 80, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2"})
	lab.waitHops(t, "node1 has the one local endpoint", "10.0.0.11")
	if graceful {
		r.checkCapability(t)
	} else if caps := neighborCaps(lab.birdc("show", "protocols", "all", "node1")); strings.Contains(caps, "Graceful restart") {
		t.Fatalf("the agent advertises graceful restart without it configured:\n%s", caps)
	}
	r.endHops = lab.sampleHops(t, vip)
	r.routeLog = &lockedBuffer{}
	mon := lab.command("router", "ip", "-4", "monitor", "route")
	mon.Stdout = r.routeLog
	if err := mon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mon.Process.Kill(); _ = mon.Wait() })
	r.wg.Add(1)
	go r.ask()
	t.Cleanup(func() { r.stop() })
	return r
}

// ask sends a request to the Service from the client every 20 ms until
// stop.
func (r *restartLab) ask() {
	defer r.wg.Done()
	for {
		select {
		case <-r.done:
			return
		case <-time.After(20 * time.Millisecond):
		}
		got, err := r.lab.get("client", vip+":80")
		r.mu.Lock()
		if err == nil && got == "pod1" {
			r.ok++
		} else {
			r.failed = append(r.failed, fmt.Sprintf("%s: %q %v", time.Now().Format("15:04:05.000"), got, err))
		}
		r.mu.Unlock()
	}
}

// stop ends the requests and the sampling of the router's next hops, and
// returns the requests answered by pod1, those that were not, and the
// next hops seen.
func (r *restartLab) stop() (ok int, failed []string, hops [][]string) {
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ok, r.failed, r.endHops()
}

func (r *restartLab) startAgent() { r.agent = r.sp.startNodeAgent(r.lab.topo, "node1", r.cfg) }

// stopAgent sends node1's agent sig and waits for it to end.
func (r *restartLab) stopAgent(sig syscall.Signal) {
	_ = r.agent.Process.Signal(sig)
	_ = r.agent.Wait()
}

// routeChanges are the changes of the router's kernel route to the VIP
// since the Service was served (ip monitor route).
func (r *restartLab) routeChanges() []string {
	var out []string
	for _, l := range strings.Split(r.routeLog.String(), "\n") {
		if strings.Contains(l, vip) {
			out = append(out, l)
		}
	}
	return out
}

// checkCapability fails the test unless BIRD's session with node1 is
// established and node1 advertised graceful restart as the speaker does:
// restart time 120 s (the default), restarted (R), and the forwarding state
// of its family, IPv4, kept (F).
func (r *restartLab) checkCapability(t *testing.T) {
	t.Helper()
	proto := r.lab.birdc("show", "protocols", "all", "node1")
	caps := neighborCaps(proto)
	for _, want := range []string{"Graceful restart", "Restart time: 120", "Restart recovery", "AF preserved: ipv4"} {
		if !strings.Contains(caps, want) {
			t.Fatalf("node1's capabilities as BIRD saw them lack %q:\n%s", want, proto)
		}
	}
}

// neighborCaps is the part of BIRD's `show protocols all` that lists the
// neighbour's capabilities.
func neighborCaps(proto string) string {
	_, caps, _ := strings.Cut(proto, "Neighbor capabilities")
	caps, _, _ = strings.Cut(caps, "Session:")
	return caps
}

var node1Proto = regexp.MustCompile(`(?m)^node1\s.*$`)

// waitBird waits until cond holds of BIRD's `show protocols all node1`,
// and returns how long it took.
func (r *restartLab) waitBird(t *testing.T, what string, cond func(proto string) bool) time.Duration {
	t.Helper()
	var proto string
	d, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		proto = r.lab.birdc("show", "protocols", "all", "node1")
		return node1Proto.MatchString(proto) && cond(proto)
	})
	if !ok {
		t.Fatalf("%s: not within 30 s; BIRD:\n%s\n%s", what, proto, r.lab.birdc("show", "route", "all"))
	}
	return d
}
