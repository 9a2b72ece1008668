package external

import (
	"context"
	"flag"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/test/cluster"
)

var outageHang = flag.Duration("outage.hang", 60*time.Second, "how long the outage tests hang kube-apiserver")

// hangAPIServer stops kube-apiserver (SIGSTOP: its sockets stay open and
// every request hangs, as with a wedged apiserver) and returns the
// function that resumes it; the test's cleanup resumes it too, also on
// failure.
func hangAPIServer(t *testing.T, cp *cluster.ControlPlane) (resume func()) {
	t.Helper()
	var pid int
	for _, p := range cp.Processes() {
		if p.Name == "kube-apiserver" {
			pid = p.Pid()
		}
	}
	if pid == 0 {
		t.Fatal("no kube-apiserver process")
	}
	resume = func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(resume)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	return resume
}

// probeThroughHang probes every ~2 s for the length of the hang; every
// probe must pass. It returns the number of probes.
func probeThroughHang(t *testing.T, what string, probe func() error) int {
	t.Helper()
	n := 0
	t0 := time.Now()
	for time.Since(t0) < *outageHang {
		n++
		start := time.Now()
		if err := probe(); err != nil {
			t.Errorf("%s: probe %d, %v into the apiserver hang: %v", what, n, time.Since(t0).Round(time.Millisecond), err)
		}
		time.Sleep(max(0, 2*time.Second-time.Since(start)))
	}
	return n
}

// startOutageCluster puts the control plane (10.0.0.2) on the nodes'
// bridge br0 in namespace sw, creates node1 and node2, starts an agent on
// each with cfg (plus a pool holding the VIP) and creates the ETP Local
// LoadBalancer Service "web" with an endpoint on each node.
func startOutageCluster(lab *topo, sw string, cfg config.Config) (*cluster.ControlPlane, kubernetes.Interface) {
	t := lab.t
	lab.add("cp")
	lab.veth(sw, "vcp", "cp", "eth0")
	lab.ip(sw, "link", "set", "vcp", "master", "br0")
	lab.ip("cp", "addr", "add", "10.0.0.2/24", "dev", "eth0")
	cp, c := lab.startControlPlane("cp", "10.0.0.2")
	createReadyNode(t, c, "node1", "10.0.0.11")
	createReadyNode(t, c, "node2", "10.0.0.12")
	cfg.Pools = []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}}
	cfg.LeaseNamespace = "default"
	for _, n := range []string{"node1", "node2"} {
		lab.startAgent(n, cfg, cp.Kubeconfig)
	}
	createLB(t, c, "web", 80, func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal })
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	return cp, c
}

type probeErr string

func (e probeErr) Error() string { return string(e) }

// TestL2ServesThroughAPIServerOutage: two agents with the l2 provider, an
// ETP Local LoadBalancer Service with an endpoint on each node. The
// kube-apiserver hangs for -outage.hang (60 s); every ~2 s the client
// forgets its neighbour entry for the VIP, so it must resolve it again,
// and opens a new connection: every one must reach the owner's pod. After
// the apiserver resumes, traffic keeps flowing and an endpoint change
// moves the VIP to the other node.
func TestL2ServesThroughAPIServerOutage(t *testing.T) {
	lab := newL2Lab(t)
	cp, c := startOutageCluster(lab, "sw", config.Config{
		L2: &l2.Config{Interfaces: []string{"eth0"}, LeaseRenewSeconds: 0.5, LeaseDurationSeconds: 1.5},
	})

	owner := l2.Owner(netip4(vip), []string{"node1", "node2"})
	other := map[string]string{"node1": "node2", "node2": "node1"}[owner]
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	ownerMAC := lab.mac(owner, "eth0")
	// probe: a fresh resolution of the VIP and a new connection.
	probe := func(wantPod, wantMAC string) error {
		lab.ip("client", "neigh", "flush", "to", vip)
		got, err := lab.get("client", vip+":80")
		if err != nil {
			return err
		}
		if got != wantPod {
			return probeErr("answered by " + got + ", want " + wantPod)
		}
		if m := lab.neigh(vip); m != wantMAC {
			return probeErr("client resolved " + vip + " to " + m + ", want " + wantMAC)
		}
		return nil
	}
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool { return probe(pod[owner], ownerMAC) == nil }); !ok {
		t.Fatalf("before the hang: %v (owner %s)", probe(pod[owner], ownerMAC), owner)
	}
	time.Sleep(2 * time.Second) // a steady state: several renewals came back to each agent

	resume := hangAPIServer(t, cp)
	n := probeThroughHang(t, "l2", func() error { return probe(pod[owner], ownerMAC) })
	resume()
	t.Logf("l2: %d probes through a %v apiserver hang, each resolving %s afresh", n, *outageHang, vip)
	if t.Failed() {
		t.FailNow()
	}

	// After the hang: no flap (every probe over the next few lease
	// durations still reaches the owner), then the endpoint change.
	for i := range 5 {
		if err := probe(pod[owner], ownerMAC); err != nil {
			t.Fatalf("probe %d after the apiserver resumed: %v", i+1, err)
		}
		time.Sleep(time.Second)
	}
	setEndpoints(t, c, "web", map[string]string{other: map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"}[other]})
	otherMAC := lab.mac(other, "eth0")
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool { return probe(pod[other], otherMAC) == nil }); !ok {
		t.Fatalf("endpoint change after the hang not followed: %v", probe(pod[other], otherMAC))
	}
}

// TestBGPServesThroughAPIServerOutage: as the L2 test, with the bgp
// provider and BIRD as the router: through the hang BIRD keeps both
// nodes' routes and every new connection works; after it, an endpoint
// change withdraws the node that lost its endpoint.
func TestBGPServesThroughAPIServerOutage(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := startOutageCluster(lab.topo, "router", config.Config{BGP: &bgp.Config{ASN: 64513,
		Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}}})
	both := []string{"10.0.0.11", "10.0.0.12"}
	lab.waitHops(t, "both nodes have a local endpoint", both...)
	probe := func() error {
		if hops := lab.nextHopsFor(vip); !slices.Equal(hops, both) {
			return probeErr("router next hops " + strings.Join(hops, ",") + ", want both nodes; birdc: " + lab.birdc("show", "route", "for", vip))
		}
		got, err := lab.get("client", vip+":80")
		if err != nil {
			return err
		}
		if !strings.HasPrefix(got, "pod") {
			return probeErr("answered by " + got)
		}
		return nil
	}
	if err := probe(); err != nil {
		t.Fatalf("before the hang: %v", err)
	}

	resume := hangAPIServer(t, cp)
	n := probeThroughHang(t, "bgp", probe)
	resume()
	t.Logf("bgp: %d probes through a %v apiserver hang", n, *outageHang)
	if t.Failed() {
		t.FailNow()
	}
	for i := range 5 {
		if err := probe(); err != nil {
			t.Fatalf("probe %d after the apiserver resumed: %v", i+1, err)
		}
		time.Sleep(time.Second)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2"})
	lab.waitHops(t, "endpoint change after the hang", "10.0.0.11")
}

// TestL2PartitionComeback: only the owner is cut off from the apiserver
// (a blackhole route to it in the owner's namespace), the segment stays
// whole. The other node sees the owner's Lease expire, but before taking
// the VIP over it probes for it, hears the owner still answering, and
// leaves it there: through the partition and after it, a client asking
// every 50 ms hears the owner alone, and is served by it.
func TestL2PartitionComeback(t *testing.T) {
	lab := newL2Lab(t)
	_, _ = startOutageCluster(lab, "sw", config.Config{
		L2: &l2.Config{Interfaces: []string{"eth0"}, LeaseRenewSeconds: 0.5, LeaseDurationSeconds: 1.5},
	})
	owner := l2.Owner(netip4(vip), []string{"node1", "node2"})
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	ownerMAC := lab.mac(owner, "eth0")
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		got, _ := lab.get("client", vip+":80")
		return got == pod[owner] && lab.neigh(vip) == ownerMAC
	}); !ok {
		t.Fatalf("before the partition: client's entry for %s is %q, want owner %s's %s", vip, lab.neigh(vip), owner, ownerMAC)
	}
	probe := lab.startL2Prober("client", "eth0", vip)
	settled, ok := probe.waitAnswers(vip, time.Now(), 10*time.Second, ownerMAC)
	if !ok {
		t.Fatalf("before the partition: %s not answered by owner %s alone: %v", vip, owner, probe.tail(vip, 5))
	}

	lab.ip(owner, "route", "add", "blackhole", "10.0.0.2/32")
	time.Sleep(6 * time.Second) // a partition of four lease durations
	if got, err := lab.get("client", vip+":80"); err != nil || got != pod[owner] {
		t.Fatalf("during the partition: %q, %v; want %s", got, err, pod[owner])
	}
	lab.ip(owner, "route", "del", "blackhole", "10.0.0.2/32")
	time.Sleep(3 * time.Second)
	if got, err := lab.get("client", vip+":80"); err != nil || got != pod[owner] {
		t.Fatalf("after the partition: %q, %v; want %s", got, err, pod[owner])
	}
	rounds := probe.since(vip, settled)
	for _, r := range rounds {
		if len(r.macs) > 1 || len(r.macs) == 1 && r.macs[0] != ownerMAC {
			t.Fatalf("through the partition a request for %s was answered by %v, want owner %s (%s) alone", vip, r, owner, ownerMAC)
		}
	}
	t.Logf("%d requests for %s through a 6 s partition of its owner from the apiserver and after: the owner alone answered", len(rounds), vip)
}
