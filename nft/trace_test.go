package nft

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

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
			if ap == netip.AddrPortFrom(podIP(i), nsutil.EchoPort) {
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
