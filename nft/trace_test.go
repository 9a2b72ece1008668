package nft

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// The trace tests program a node namespace, ask the trace where a new
// connection goes, then send it for real and check that it went there:
// the endpoints that answer are those the trace names, the source the pod
// sees says whether it was masqueraded, and a refused or dropped connection
// is what the trace says.

// traceQuery is a trace of network (tcp, udp) from src (invalid: the node)
// to dst.
func traceQuery(t *testing.T, tp *topo, src netip.Addr, network, dst string) *dataplane.Trace {
	t.Helper()
	q := dataplane.TraceQuery{From: src, FromNode: !src.IsValid(), To: netip.MustParseAddrPort(dst), Protocol: network}
	tr, err := tp.b.Trace(context.Background(), q)
	if err != nil {
		t.Fatalf("trace %s %s -> %s: %v", network, src, dst, err)
	}
	if tr.Method != TraceMethod {
		t.Errorf("method %q", tr.Method)
	}
	var b strings.Builder
	if err := tr.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", b.String())
	// -o json says the same.
	var j bytes.Buffer
	var back dataplane.Trace
	if err := tr.WriteJSON(&j); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(j.Bytes(), &back); err != nil || back.Method != tr.Method || !reflect.DeepEqual(back.Match, tr.Match) ||
		!reflect.DeepEqual(back.Endpoints(), tr.Endpoints()) || !reflect.DeepEqual(back.Checks, tr.Checks) || !reflect.DeepEqual(back.Affinity, tr.Affinity) {
		t.Errorf("the JSON output does not read back as the trace (%v):\n%s", err, j.String())
	}
	return tr
}

// podNames names the pods behind endpoints (pod i answers on podIP(i):8080).
func podNames(t *testing.T, endpoints map[string]float64) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for ep, w := range endpoints {
		ap := netip.MustParseAddrPort(ep)
		name := ""
		for i := range 8 {
			if ap == netip.AddrPortFrom(podIP(i), nsutil.EchoPort) || ap == netip.AddrPortFrom(podIP6(i), nsutil.EchoPort) {
				name = nsutil.PodName(i)
			}
		}
		if name == "" {
			t.Fatalf("trace names endpoint %s, which is no test pod", ep)
		}
		out[name] = w
	}
	return out
}

// verdicts returns the verdicts of the trace's outcomes.
func verdicts(tr *dataplane.Trace) []string {
	var v []string
	for _, o := range tr.Outcomes {
		if !slices.Contains(v, o.Verdict) {
			v = append(v, o.Verdict)
		}
	}
	slices.Sort(v)
	return v
}

// masqueraded reports whether every accepted outcome is masqueraded (true),
// none is (false); mixed outcomes fail the test.
func masqueraded(t *testing.T, tr *dataplane.Trace) bool {
	t.Helper()
	var m []bool
	for _, o := range tr.Outcomes {
		if o.Verdict == "accept" && !slices.Contains(m, o.Masquerade) {
			m = append(m, o.Masquerade)
		}
	}
	if len(m) != 1 {
		t.Fatalf("want one masquerade decision for all outcomes, got %v", tr.Outcomes)
	}
	return m[0]
}

// agree traces a connection from the namespace from (source src; invalid:
// from is the node) to dst, then makes count real ones and checks that they
// went where the trace said. It returns the trace.
func agree(t *testing.T, tp *topo, from *nsutil.NS, src netip.Addr, network, dst string, count int) *dataplane.Trace {
	t.Helper()
	tr := traceQuery(t, tp, src, network, dst)
	switch v := verdicts(tr); {
	case slices.Equal(v, []string{"drop"}):
		mustDrop(t, from, network, dst)
	case slices.Equal(v, []string{"reject"}):
		mustRefuse(t, from, network, dst)
	case slices.Equal(v, []string{"accept"}):
		want := podNames(t, tr.Endpoints())
		seen, lastSrc := ask(t, from, network, dst, count)
		if !slices.Equal(slices.Sorted(maps.Keys(seen)), slices.Sorted(maps.Keys(want))) {
			t.Errorf("%s %s: the trace says %v, the packets reached %v", network, dst, want, seen)
		}
		srcIP, _, _ := strings.Cut(lastSrc, ":")
		if strings.HasPrefix(lastSrc, "[") {
			srcIP = strings.Trim(lastSrc[:strings.LastIndex(lastSrc, ":")], "[]")
		}
		traced := strings.TrimSuffix(strings.TrimPrefix(tr.From, "node ("), ")")
		kept := srcIP == traced
		if masq := masqueraded(t, tr); masq == kept {
			t.Errorf("%s %s: the trace says masquerade %v, the pod saw the source %s (client %s)", network, dst, masq, lastSrc, traced)
		}
	default:
		t.Fatalf("%s %s: outcomes with verdicts %v: not one answer to check", network, dst, v)
	}
	return tr
}

// wantEqualWeights checks that the trace spreads over n endpoints equally.
func wantEqualWeights(t *testing.T, tr *dataplane.Trace, n int) {
	t.Helper()
	eps := tr.Endpoints()
	if len(eps) != n {
		t.Fatalf("want %d endpoints, trace has %v", n, eps)
	}
	for ep, w := range eps {
		if d := w - 1/float64(n); d > 1e-9 || d < -1e-9 {
			t.Errorf("endpoint %s has weight %v, want 1/%d", ep, w, n)
		}
	}
}

func wantMatch(t *testing.T, tr *dataplane.Trace, kind, service string) {
	t.Helper()
	if tr.Match == nil || tr.Match.Kind != kind || tr.Match.Service != service {
		t.Errorf("want a %s element of %s, trace matched %+v", kind, service, tr.Match)
	}
}

func wantCheck(t *testing.T, tr *dataplane.Trace, substr string) {
	t.Helper()
	for _, c := range tr.Checks {
		if strings.Contains(c, substr) {
			return
		}
	}
	t.Errorf("want a check saying %q, got %q", substr, tr.Checks)
}

func TestTraceClusterIPAndNodePort(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
		p.ClusterEndpoints = eps(8080, 1, 2)
	})
	tp.sync(t, snapshot(web), true)
	const svc = "default/web:p/tcp/ipv4"
	for _, network := range []string{"tcp", "udp"} {
		// A pod: both endpoints, its own source.
		tr := agree(t, tp, tp.pods[0], podIP(0), network, "10.96.0.10:80", 30)
		wantMatch(t, tr, "cluster-ip", strings.Replace(svc, "tcp", network, 1))
		wantEqualWeights(t, tr, 2)
		if tr.Hook != "prerouting" || len(tr.Steps) == 0 || tr.Steps[0].Chain != chainNatPrerouting {
			t.Errorf("want the path to start at hook prerouting, chain %s: %+v", chainNatPrerouting, tr.Steps)
		}
		// A client outside the cluster CIDRs: masqueraded.
		tr = agree(t, tp, tp.client, netip.MustParseAddr(clientIP), network, "10.96.0.10:80", 30)
		if !strings.Contains(tr.Outcomes[0].Why, "outside the cluster CIDRs") {
			t.Errorf("want the masquerade explained by the cluster CIDR, got %q", tr.Outcomes[0].Why)
		}
		// The node port, Cluster policy: masqueraded.
		tr = agree(t, tp, tp.client, netip.MustParseAddr(clientIP), network, nodeIP+":30080", 30)
		wantMatch(t, tr, "node-port", strings.Replace(svc, "tcp", network, 1))
		wantEqualWeights(t, tr, 2)
		if !strings.Contains(tr.Outcomes[0].Why, "node port") {
			t.Errorf("want the masquerade explained by the node port's Cluster policy, got %q", tr.Outcomes[0].Why)
		}
		// The node itself, through hook output.
		tr = agree(t, tp, tp.node, netip.Addr{}, network, "10.96.0.10:80", 30)
		if tr.Hook != "output" || tr.Steps[0].Chain != chainNatOutput {
			t.Errorf("want the node's path to start at hook output, chain %s: %+v", chainNatOutput, tr.Steps)
		}
	}
	// A port the cluster IP does not define is rejected, an address of the
	// Service CIDR no Service holds dropped.
	tr := agree(t, tp, tp.pods[0], podIP(0), "tcp", "10.96.0.10:81", 1)
	wantCheck(t, tr, "does not define")
	tr = agree(t, tp, tp.pods[0], podIP(0), "tcp", "10.96.0.99:80", 1)
	wantCheck(t, tr, "no Service holds")
}

func TestTraceExternalAndLoadBalancerIPs(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ExternalIPs = []netip.Addr{extIP}
		p.LoadBalancerIPs = []netip.Addr{lbIP}
		p.ClusterEndpoints = eps(8080, 1, 2)
	})
	tp.sync(t, snapshot(web), true)
	client := netip.MustParseAddr(clientIP)
	for _, network := range []string{"tcp", "udp"} {
		svc := "default/web:p/" + network + "/ipv4"
		for _, c := range []struct{ dst, kind string }{{"203.0.113.10:80", "external-ip"}, {"203.0.113.11:80", "load-balancer"}} {
			tr := agree(t, tp, tp.client, client, network, c.dst, 30)
			wantMatch(t, tr, c.kind, svc)
			wantEqualWeights(t, tr, 2)
			if !strings.Contains(tr.Outcomes[0].Why, "externalTrafficPolicy: Cluster") {
				t.Errorf("want the masquerade explained by the Cluster policy, got %q", tr.Outcomes[0].Why)
			}
		}
	}
}

func TestTraceExternalTrafficPolicyLocal(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	local := externalLocalService
	tp.sync(t, snapshot(local(1)), true)
	client := netip.MustParseAddr(clientIP)
	for _, dst := range []string{nodeIP + ":30080", "203.0.113.10:80"} {
		// An outside client: this node's endpoint, its source kept.
		tr := agree(t, tp, tp.client, client, "tcp", dst, 10)
		wantEqualWeights(t, tr, 1)
		wantCheck(t, tr, "this node's endpoints only")
	}
	// A pod: all endpoints, its source kept; the node: all, masqueraded.
	tr := agree(t, tp, tp.pods[0], podIP(0), "tcp", "203.0.113.10:80", 30)
	wantEqualWeights(t, tr, 2)
	wantCheck(t, tr, "inside the cluster CIDRs")
	tr = agree(t, tp, tp.node, netip.Addr{}, "tcp", "203.0.113.10:80", 30)
	wantEqualWeights(t, tr, 2)
	wantCheck(t, tr, "the client is this node")
	// No endpoint on this node: dropped.
	tp.sync(t, snapshot(local()), false)
	for _, dst := range []string{nodeIP + ":30080", "203.0.113.10:80"} {
		tr := agree(t, tp, tp.client, client, "tcp", dst, 1)
		wantCheck(t, tr, "no endpoint on this node: dropped")
	}
}

func TestTraceInternalTrafficPolicyLocal(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	mk := internalLocalService
	tp.sync(t, snapshot(mk(2)), true)
	tr := agree(t, tp, tp.pods[0], podIP(0), "tcp", "10.96.0.10:80", 10)
	wantEqualWeights(t, tr, 1)
	wantCheck(t, tr, "this node's endpoints only")
	tr = agree(t, tp, tp.client, netip.MustParseAddr(clientIP), "tcp", nodeIP+":30080", 30)
	wantEqualWeights(t, tr, 2)
	wantCheck(t, tr, "reaches all endpoints")
	// Endpoints on other nodes only: dropped, not rejected.
	tp.sync(t, snapshot(mk()), false)
	tr = agree(t, tp, tp.pods[0], podIP(0), "tcp", "10.96.0.10:80", 1)
	wantCheck(t, tr, "endpoints on other nodes only")
}

func TestTraceSourceRanges(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.LoadBalancerIPs = []netip.Addr{lbIP}
		p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/25")}
		p.ClusterEndpoints = eps(8080, 1, 2)
	})
	tp.sync(t, snapshot(web), true)
	for _, network := range []string{"tcp", "udp"} {
		svc := "default/web:p/" + network + "/ipv4"
		tr := agree(t, tp, tp.client, netip.MustParseAddr(clientIP), network, "203.0.113.11:80", 30)
		wantCheck(t, tr, "within the ranges")
		wantMatch(t, tr, "load-balancer", svc)
		wantEqualWeights(t, tr, 2)
		tr = agree(t, tp, tp.client2, netip.MustParseAddr(client2IP), network, "203.0.113.11:80", 1)
		wantCheck(t, tr, "outside the ranges")
		wantMatch(t, tr, "load-balancer", svc)
	}
}

func TestTraceNoEndpoints(t *testing.T) {
	t.Parallel()
	tp, _ := newTopoWithoutEndpoints(t)
	for _, c := range []struct {
		from *nsutil.NS
		src  netip.Addr
		dst  string
	}{{tp.pods[0], podIP(0), "10.96.0.10:80"}, {tp.client, netip.MustParseAddr(clientIP), nodeIP + ":30080"}} {
		tr := agree(t, tp, c.from, c.src, "tcp", c.dst, 1)
		wantCheck(t, tr, "no endpoints: new connections are rejected")
		if tr.Match == nil || tr.Match.Target != "goto reject" {
			t.Errorf("want the no-endpoints element, got %+v", tr.Match)
		}
	}
	// The node's own connection to its node port is refused on its way back
	// in through loopback, as kube-proxy refuses it: a datagram too, which a
	// reject on output would fail with EPERM instead.
	for _, network := range []string{"tcp", "udp"} {
		tr := agree(t, tp, tp.node, netip.Addr{}, network, nodeIP+":30080", 1)
		wantCheck(t, tr, "no endpoints: new connections are rejected")
		var rejectedAt string
		for _, o := range tr.Outcomes {
			for _, s := range append(slices.Clone(tr.Steps), o.Steps...) {
				if s.Hook != "" {
					rejectedAt = s.Hook
				}
			}
		}
		if rejectedAt != "input" {
			t.Errorf("%s: want the node's own packet rejected at hook input, the trace ends at hook %q", network, rejectedAt)
		}
	}
}

func TestTraceAffinity(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1, 2)
		p.Affinity.TimeoutSeconds = 600
	})
	tp.sync(t, snapshot(web), true)
	tr := traceQuery(t, tp, podIP(0), "tcp", "10.96.0.10:80")
	wantEqualWeights(t, tr, 2)
	if tr.Affinity == nil || tr.Affinity.Pinned {
		t.Fatalf("before its first connection the client must not be pinned: %+v", tr.Affinity)
	}
	first, _ := ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 1)
	tr = agree(t, tp, tp.pods[0], podIP(0), "tcp", "10.96.0.10:80", 10)
	wantEqualWeights(t, tr, 1)
	a := tr.Affinity
	if a == nil || !a.Pinned {
		t.Fatalf("after a connection the client must be pinned: %+v", a)
	}
	pinned := podNames(t, map[string]float64{a.Endpoint: 1})
	if _, ok := pinned[slices.Collect(maps.Keys(first))[0]]; !ok {
		t.Errorf("the trace pins the client to %s, its first connection went to %v", a.Endpoint, first)
	}
}

func TestTraceHairpin(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 0)
	})
	tp.sync(t, snapshot(web), true)
	tr := agree(t, tp, tp.pods[0], podIP(0), "tcp", "10.96.0.10:80", 3)
	if !strings.Contains(tr.Outcomes[0].Why, "hairpin") {
		t.Errorf("want the masquerade explained as a hairpin, got %q", tr.Outcomes[0].Why)
	}
	// Another pod keeps its source.
	agree(t, tp, tp.pods[1], podIP(1), "tcp", "10.96.0.10:80", 3)
}

// A UDP flow that exists keeps going to its endpoint after the Service
// moved on: the trace says so, and the packet does so.
func TestTraceConntrackWins(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	mk := func(idx int) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, idx)
			p.Hairpin = []netip.Addr{}
		})
	}
	tp.sync(t, snapshot(mk(1)), true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := tp.pods[0].Dial(ctx, "udp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if r, err := nsutil.AskOn(c, 2*time.Second); err != nil || r.Name != nsutil.PodName(1) {
		t.Fatalf("first exchange: %+v %v", r, err)
	}
	tp.sync(t, snapshot(mk(2)), false)
	sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	tr, err := tp.b.Trace(ctx, dataplane.TraceQuery{From: podIP(0), SourcePort: sport, To: netip.MustParseAddrPort("10.96.0.10:80"), Protocol: "udp"})
	if err != nil {
		t.Fatal(err)
	}
	want := netip.AddrPortFrom(podIP(1), 8080).String()
	if len(tr.Conntrack) != 1 || !tr.Conntrack[0].Exact || !tr.Conntrack[0].Elsewhere || tr.Conntrack[0].Endpoint != want {
		t.Fatalf("want one conntrack entry of this flow to %s, elsewhere than the ruleset: %+v", want, tr.Conntrack)
	}
	if eps := tr.Endpoints(); len(eps) != 1 || eps[netip.AddrPortFrom(podIP(2), 8080).String()] != 1 {
		t.Errorf("a new connection goes to pod2, trace says %v", eps)
	}
	if r, err := nsutil.AskOn(c, 2*time.Second); err != nil || r.Name != nsutil.PodName(1) {
		t.Errorf("the flow must follow its conntrack entry to pod1: %+v %v", r, err)
	}
	// A new flow follows the ruleset, and the trace of the client without
	// a port lists the old flow as one going elsewhere.
	agree(t, tp, tp.pods[0], podIP(0), "udp", "10.96.0.10:80", 3)
}

// IPv6 puts addresses in four register slots and ports after them: the
// same ways in, traced and sent over IPv6.
func TestTraceIPv6(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	key := portal.ServiceKey{Namespace: "default", Name: "ds"}
	svc := &portal.Service{Key: key}
	for _, proto := range []portal.Protocol{portal.TCP, portal.UDP} {
		svc.Portals = append(svc.Portals, &portal.Portal{
			Key: portal.PortKey{Service: key, Port: "p", Protocol: proto, Family: portal.IPv6}, Port: 80,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:96::10")}, NodePort: 30080,
			ExternalIPs:      []netip.Addr{netip.MustParseAddr("2001:db8:99::10")},
			ClusterEndpoints: []netip.AddrPort{netip.AddrPortFrom(podIP6(1), 8080), netip.AddrPortFrom(podIP6(2), 8080)}})
	}
	tp.sync(t, snapshot(svc), true)
	client := netip.MustParseAddr(clientIP6)
	for _, network := range []string{"tcp", "udp"} {
		tr := agree(t, tp, tp.pods[0], podIP6(0), network, "[fd00:96::10]:80", 30)
		wantMatch(t, tr, "cluster-ip", "default/ds:p/"+network+"/ipv6")
		wantEqualWeights(t, tr, 2)
		tr = agree(t, tp, tp.client, client, network, "["+nodeIP6+"]:30080", 30)
		wantMatch(t, tr, "node-port", "default/ds:p/"+network+"/ipv6")
		agree(t, tp, tp.client, client, network, "[2001:db8:99::10]:80", 30)
	}
}
