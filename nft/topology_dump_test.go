package nft

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/onehop/onehop/portal"
)

// dumpTopology returns what dump-rules says of svc's topology, per port.
func dumpTopology(t *testing.T, b *Backend) map[string]string {
	t.Helper()
	d, err := b.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range d.Ports {
		out[p.Service] = p.Topology
	}
	return out
}

// dump-rules reads a portal's Topology back from the kernel: from the
// chain that holds its Cluster-policy endpoints, the svc chain, or the all
// chain under internalTrafficPolicy: Local. A change of topology alone
// rewrites that chain's rule and no element; a new process finds the
// tags as it would write them and sends nothing; a text too long for a
// rule's user data is cut, not refused by the kernel.
func TestDumpTopology(t *testing.T) {
	tp := newTopo(t, 3)
	near := func(topology string) *portal.Service {
		return service("near", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
			p.ClusterEndpoints = eps(8080, 0)
			p.Topology = topology
		})
	}
	local := service("local", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.2")}
		p.NodePort = 30080
		p.InternalLocal = true
		p.ClusterEndpoints = eps(8080, 1)
		p.LocalEndpoints = eps(8080, 1, 2)
		p.Topology = "zone hints for z1"
	})
	plain := service("plain", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.3")}
		p.ClusterEndpoints = eps(8080, 0, 1)
	})
	tp.sync(t, snapshot(near("node hints for node-1"), local, plain), true)
	got := dumpTopology(t, tp.b)
	for svc, want := range map[string]string{
		"default/near:p/tcp/ipv4":  "node hints for node-1",
		"default/local:p/udp/ipv4": "zone hints for z1",
		"default/plain:p/tcp/ipv4": "",
	} {
		if got[svc] != want {
			t.Errorf("%s: topology %q, want %q", svc, got[svc], want)
		}
	}
	ask(t, tp.pods[1], "tcp", "10.96.0.1:80", 2)

	// The same endpoint, another reason: the rule is rewritten.
	snap := snapshot(near("none: no endpoint hinted for node node-1; no endpoint hinted for zone z1"), local, plain)
	snap.Dirty = []portal.ServiceKey{{Namespace: "default", Name: "near"}}
	if st := tp.sync(t, snap, false); st.Changed != 2 {
		t.Errorf("a new topology changed %d portals, want near's 2", st.Changed)
	}
	if got := dumpTopology(t, tp.b)["default/near:p/udp/ipv4"]; got != "none: no endpoint hinted for node node-1; no endpoint hinted for zone z1" {
		t.Errorf("after the change: topology %q", got)
	}

	// A restart reads the tags back and finds nothing to do.
	again := New(tp.b.cfg, WithNetNS(tp.node.FD()))
	snap.Dirty = nil
	st, err := again.Sync(context.Background(), snap, true)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ReadBack || st.Messages != 0 {
		t.Errorf("a new process read the table back: %v, and sent %d messages; want nothing sent", st.ReadBack, st.Messages)
	}

	// A node name as long as a name can be.
	long := "node hints for " + strings.Repeat("n", 253)
	tp.sync(t, snapshot(near(long), local, plain), false)
	if got := dumpTopology(t, tp.b)["default/near:p/tcp/ipv4"]; !strings.HasPrefix(long, strings.TrimSuffix(got, "...")) || len(got) != maxTopologyText {
		t.Errorf("a long topology reads back as %q", got)
	}
	// nft reads no comment into such a tag: its listing is still onehop's.
	if _, err := exec.LookPath("nft"); err == nil {
		compareWithNft(t, tp, readTable(t, tp), requireNft(t))
	}
}
