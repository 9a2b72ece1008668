package nft

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/nftables"

	"github.com/onehop/onehop/portal"
)

// stuckTo sends n requests from the client and returns the one endpoint
// that answered them all (failing the test when more than one did).
func stuckTo(t *testing.T, tp *topo, what string, n int) string {
	t.Helper()
	seen, _ := ask(t, tp.client, "tcp", "10.96.0.10:80", n)
	if len(seen) != 1 {
		t.Fatalf("%s: ClientIP affinity must keep the client on one endpoint, got %v", what, seen)
	}
	for name := range seen {
		return name
	}
	return ""
}

// TestStateSurvivesFullSyncsAndRestarts: a full sync reconciles the table
// in place, so a client remembered for ClientIP affinity stays on its
// endpoint and counters keep counting across an endpoint leaving, a new
// timeout, a full sync, and a new process (an agent restart) whose first
// full sync finds the table it left.
func TestStateSurvivesFullSyncsAndRestarts(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	mk := func(timeout uint32, idx ...int) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.NodePort = 30080
			p.ExternalLocal = true
			p.ClusterEndpoints = eps(8080, idx...)
			p.LocalEndpoints = eps(8080, idx...)
			p.Affinity.TimeoutSeconds = timeout
		})
	}
	other := service("other", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		p.Port = 81
		p.ClusterEndpoints = eps(8080, 0, 1)
	})
	tp.sync(t, snapshot(mk(600, 0, 1, 2), other), true)
	stuck := stuckTo(t, tp, "first sync", 10)
	var keep []int
	for i := 0; i < 3; i++ {
		if "pod"+string(rune('0'+i)) == stuck || len(keep) == 0 {
			keep = append(keep, i)
		}
	}
	if len(keep) == 1 {
		keep = append(keep, (keep[0]+1)%3)
	}
	// An endpoint the client is not on leaves.
	tp.sync(t, snapshot(mk(600, keep...), other), false)
	if got := stuckTo(t, tp, "an endpoint left", 5); got != stuck {
		t.Errorf("an endpoint left: client moved from %s to %s", stuck, got)
	}
	// A new timeout keeps the remembered clients.
	st := tp.sync(t, snapshot(mk(900, keep...), other), false)
	if got := stuckTo(t, tp, "new timeout", 5); got != stuck {
		t.Errorf("a new timeout: client moved from %s to %s", stuck, got)
	}
	t.Logf("a new timeout: %d netlink messages", st.Messages)
	packets := portPackets(t, tp, "default/web:p/tcp/ipv4")
	// A full sync of the same state sends nothing.
	if st := tp.sync(t, snapshot(mk(900, keep...), other), true); st.Messages != 0 {
		t.Errorf("a full sync of the state the kernel holds sent %d messages, want 0", st.Messages)
	}
	if got := stuckTo(t, tp, "full sync", 5); got != stuck {
		t.Errorf("a full sync: client moved from %s to %s", stuck, got)
	}
	after := portPackets(t, tp, "default/web:p/tcp/ipv4")
	if after < packets+5 {
		t.Errorf("counters: %d packets before, %d after 5 more requests and a full sync: reset?", packets, after)
	}

	// A new process, as after an agent restart: its first sync is full
	// and finds the table as the old one left it.
	restarted := New(tp.b.cfg, WithNetNS(tp.node.FD()))
	tp.b = restarted
	if st := tp.sync(t, snapshot(mk(900, keep...), other), true); st.Messages != 0 {
		t.Errorf("the first sync of a new process over an unchanged table sent %d messages, want 0", st.Messages)
	}
	if got := stuckTo(t, tp, "restart", 5); got != stuck {
		t.Errorf("a restart: client moved from %s to %s", stuck, got)
	}
	if n := portPackets(t, tp, "default/web:p/tcp/ipv4"); n < after+5 {
		t.Errorf("counters after a restart: %d, want at least %d", n, after+5)
	}
	// An incremental sync after the restart works on what the full sync
	// adopted: the other Service's endpoints change as an element update.
	other2 := service("other", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		p.Port = 81
		p.ClusterEndpoints = eps(8080, 0, 2)
	})
	// One element out and one in per portal (TCP and UDP), and the
	// hairpin pair of the pod that left.
	if st := tp.sync(t, snapshot(mk(900, keep...), other2), false); st.Messages > 5 {
		t.Errorf("one endpoint replaced after a restart took %d messages: not an element update", st.Messages)
	}
	seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.11:81", 30)
	if seen["pod1"] != 0 || len(seen) != 2 {
		t.Errorf("after a restart and an endpoint change: %v", seen)
	}

	// A restart that finds a Service gone and another new: the gone one's
	// chains and elements leave, nothing else is touched.
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	tp.sync(t, snapshot(mk(900, keep...)), true)
	if got := stuckTo(t, tp, "restart with a Service gone", 5); got != stuck {
		t.Errorf("a restart with another Service gone: client moved from %s to %s", stuck, got)
	}
	if _, err := tp.pods[0].Ask("tcp", "10.96.0.11:81", 0); err == nil {
		t.Errorf("a Service deleted while the agent was down still answers")
	}
	conn, err := newConn(tp.node.FD())
	if err != nil {
		t.Fatal(err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chains {
		if _, pk, ok := parsePortalChain(c.Name); ok && pk.Service.Name == "other" {
			t.Errorf("chain %s of a deleted Service left behind", c.Name)
		}
	}
	if err := tp.b.Check(context.Background()); err != nil {
		t.Errorf("drift check after an in-place full sync: %v", err)
	}
}
