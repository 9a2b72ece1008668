package nft

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// mustFail asserts that a request is dropped (times out), not refused.
func mustDrop(t *testing.T, from *nsutil.NS, network, addr string) {
	t.Helper()
	_, err := from.Ask(network, addr, 700*time.Millisecond)
	if err == nil {
		t.Errorf("%s %s from %s: answered, want dropped", network, addr, from.Name)
		return
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%s %s from %s: refused, want dropped", network, addr, from.Name)
	}
}

func mustRefuse(t *testing.T, from *nsutil.NS, network, addr string) {
	t.Helper()
	_, err := from.Ask(network, addr, 2*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%s %s from %s: want connection refused, got %v", network, addr, from.Name, err)
	}
}

func TestSessionAffinity(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	mk := func(timeout uint32) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, 1, 2)
			p.Affinity.TimeoutSeconds = timeout
		})
	}
	tp.sync(t, snapshot(mk(10800)), true)
	for _, network := range []string{"tcp", "udp"} {
		if seen, _ := ask(t, tp.pods[0], network, "10.96.0.10:80", 20); len(seen) != 1 {
			t.Errorf("%s with ClientIP affinity: one client must stick to one endpoint, got %v", network, seen)
		}
	}
	// Off at run time: spread again.
	tp.sync(t, snapshot(mk(0)), false)
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 40); len(seen) != 2 {
		t.Errorf("affinity off: want both endpoints, got %v", seen)
	}
	// On again, and an endpoint change keeps clients on endpoints that remain.
	tp.sync(t, snapshot(mk(60)), false)
	seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 10)
	if len(seen) != 1 {
		t.Fatalf("affinity on again: got %v", seen)
	}
	stuck := ""
	for name := range seen {
		stuck = name
	}
	other := 2
	if stuck == "pod2" {
		other = 1
	}
	// Replace the other endpoint: the client stays where it was.
	moved := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 3-other, 0)
		if other == 1 {
			p.ClusterEndpoints = eps(8080, 0, 2)
		}
		p.Affinity.TimeoutSeconds = 60
	})
	tp.sync(t, snapshot(moved), false)
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 10); seen[stuck] != 10 {
		t.Errorf("after replacing the other endpoint, the client must stay on %s: %v", stuck, seen)
	}
}

func TestExternalTrafficPolicyLocal(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	local := externalLocalService
	tp.sync(t, snapshot(local(1)), true)
	for _, network := range []string{"tcp", "udp"} {
		for _, addr := range []string{nodeIP + ":30080", "203.0.113.10:80"} {
			seen, src := ask(t, tp.client, network, addr, 10)
			if seen["pod1"] != 10 {
				t.Errorf("%s %s: Local policy must reach the local endpoint only, got %v", network, addr, seen)
			}
			if !strings.HasPrefix(src, clientIP+":") {
				t.Errorf("%s %s: Local policy must keep the client's source, pod saw %s", network, addr, src)
			}
		}
	}
	// Pods reaching the external IP are short-circuited to all endpoints.
	if seen, src := ask(t, tp.pods[0], "tcp", "203.0.113.10:80", 30); len(seen) != 2 || !strings.HasPrefix(src, podIP(0).String()) {
		t.Errorf("pod to external IP: want all endpoints and its own source, got %v from %s", seen, src)
	}
	// No local endpoint: external traffic is dropped, not rejected.
	tp.sync(t, snapshot(local()), false)
	mustDrop(t, tp.client, "tcp", nodeIP+":30080")
	mustDrop(t, tp.client, "tcp", "203.0.113.10:80")
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 10); len(seen) == 0 {
		t.Errorf("cluster IP must keep working without local endpoints")
	}
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	mk := internalLocalService
	tp.sync(t, snapshot(mk(2)), true)
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 10); seen["pod2"] != 10 {
		t.Errorf("internal Local: want the local endpoint only, got %v", seen)
	}
	// External traffic (Cluster policy) still reaches all endpoints.
	if seen, _ := ask(t, tp.client, "tcp", nodeIP+":30080", 30); len(seen) != 2 {
		t.Errorf("NodePort under internal Local: want all endpoints, got %v", seen)
	}
	tp.sync(t, snapshot(mk()), false)
	mustDrop(t, tp.pods[0], "tcp", "10.96.0.10:80")
}

func TestLoadBalancerSourceRanges(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.LoadBalancerIPs = []netip.Addr{lbIP}
		p.NodePort = 30080
		p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/25")}
		p.ClusterEndpoints = eps(8080, 0, 1)
	})
	tp.sync(t, snapshot(web), true)
	for _, network := range []string{"tcp", "udp"} {
		ask(t, tp.client, network, "203.0.113.11:80", 3)
		mustDrop(t, tp.client2, network, "203.0.113.11:80")
	}
	// Without the NodePort option, NodePorts are not filtered.
	ask(t, tp.client2, "tcp", nodeIP+":30080", 1)

	// With no endpoints, as kube-proxy: a client outside the ranges is
	// dropped, one inside is told the port is closed.
	empty := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.LoadBalancerIPs = []netip.Addr{lbIP}
		p.NodePort = 30080
		p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/25")}
	})
	tp.sync(t, snapshot(empty), false)
	for _, network := range []string{"tcp", "udp"} {
		mustRefuse(t, tp.client, network, "203.0.113.11:80")
		mustDrop(t, tp.client2, network, "203.0.113.11:80")
	}
	tp.sync(t, snapshot(web), false)
	ask(t, tp.client, "tcp", "203.0.113.11:80", 3)
	mustDrop(t, tp.client2, "tcp", "203.0.113.11:80")
}

func TestServiceCIDRChecks(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1)
	})
	tp.sync(t, snapshot(web), true)
	mustRefuse(t, tp.pods[0], "tcp", "10.96.0.10:81") // undefined port of an allocated IP
	mustDrop(t, tp.pods[0], "tcp", "10.96.0.99:80")   // unallocated cluster IP
	ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 1)
}

func TestEndpointReplacementTouchesNoRule(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	mk := func(idx ...int) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, idx...)
		})
	}
	tp.sync(t, snapshot(mk(1, 2)), true)
	ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 6)
	before := portPackets(t, tp, "default/web:p/tcp/ipv4")
	st := tp.sync(t, snapshot(mk(0, 1)), false)
	t.Logf("replacement sync: %+v", st)
	if after := portPackets(t, tp, "default/web:p/tcp/ipv4"); after != before {
		t.Errorf("the chain's counter went from %d to %d: its rule was rewritten", before, after)
	}
	seen, _ := ask(t, tp.pods[1], "tcp", "10.96.0.10:80", 30)
	if seen["pod2"] != 0 || seen["pod0"] == 0 || seen["pod1"] == 0 {
		t.Errorf("after replacing pod2 with pod0: %v", seen)
	}
	d, err := tp.b.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Ports {
		if p.Service == "default/web:p/tcp/ipv4" && len(p.Endpoints) != 2 {
			t.Errorf("dump shows endpoints %v", p.Endpoints)
		}
	}
}
