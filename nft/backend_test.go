package nft

import (
	"context"
	"errors"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/onehop/onehop/portal"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the kernel's state")

var (
	clusterIP = netip.MustParseAddr("10.96.0.10")
	extIP     = netip.MustParseAddr("203.0.113.10")
	lbIP      = netip.MustParseAddr("203.0.113.11")
)

func TestClusterIPReachesAllEndpoints(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1, 2)
	})
	tp.sync(t, snapshot(web), true)
	for _, network := range []string{"tcp", "udp"} {
		seen, src := ask(t, tp.pods[0], network, "10.96.0.10:80", 40)
		if seen["pod1"] == 0 || seen["pod2"] == 0 || len(seen) != 2 {
			t.Errorf("%s: want both endpoints pod1 and pod2, got %v", network, seen)
		}
		if !strings.HasPrefix(src, podIP(0).String()+":") {
			t.Errorf("%s: pod-to-service traffic must keep its source, pod saw %s", network, src)
		}
	}
}

func TestExternalWaysIn(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
		p.ExternalIPs = []netip.Addr{extIP}
		p.LoadBalancerIPs = []netip.Addr{lbIP}
		p.ClusterEndpoints = eps(8080, 0, 1)
	})
	tp.sync(t, snapshot(web), true)
	for _, network := range []string{"tcp", "udp"} {
		for _, addr := range []string{nodeIP + ":30080", "203.0.113.10:80", "203.0.113.11:80"} {
			seen, src := ask(t, tp.client, network, addr, 20)
			if len(seen) != 2 {
				t.Errorf("%s %s: want both endpoints, got %v", network, addr, seen)
			}
			// Cluster policy: external traffic is masqueraded to the node.
			if !strings.HasPrefix(src, "10.244.") || !strings.Contains(src, ".1:") {
				t.Errorf("%s %s: want the node's address as source (masquerade), pod saw %s", network, addr, src)
			}
		}
	}
	// A cluster IP from outside the cluster CIDR is masqueraded too.
	_, src := ask(t, tp.client, "tcp", "10.96.0.10:80", 1)
	if strings.HasPrefix(src, clientIP) {
		t.Errorf("cluster IP from outside the cluster CIDR: want masquerade, pod saw %s", src)
	}
	// NodePorts are not served on other addresses of the node.
	if _, err := tp.client.Ask("tcp", "192.0.2.1:30080", time.Second); err == nil {
		t.Errorf("NodePort answered on an address outside --nodeport-addresses")
	}
}

func TestNoEndpointsRejects(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 1)
	empty := service("empty", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30081
		p.ExternalIPs = []netip.Addr{extIP}
	})
	tp.sync(t, snapshot(empty), true)
	cases := []struct {
		from *string
		addr string
	}{
		{nil, "10.96.0.10:80"},
		{&clientIP0, nodeIP + ":30081"},
		{&clientIP0, "203.0.113.10:80"},
	}
	for _, c := range cases {
		from := tp.pods[0]
		if c.from != nil {
			from = tp.client
		}
		for _, network := range []string{"tcp", "udp"} {
			start := time.Now()
			_, err := from.Ask(network, c.addr, 3*time.Second)
			took := time.Since(start)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s %s with no endpoints: want connection refused, got %v after %v", network, c.addr, err, took)
				continue
			}
			t.Logf("%s %s refused after %v", network, c.addr, took)
		}
	}
}

var clientIP0 = clientIP

func TestHairpin(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1)
		p.Hairpin = []netip.Addr{podIP(1)} // pod1 is on this node
	})
	tp.sync(t, snapshot(web), true)
	for _, network := range []string{"tcp", "udp"} {
		seen, src := ask(t, tp.pods[1], network, "10.96.0.10:80", 3)
		if seen["pod1"] != 3 {
			t.Fatalf("%s: pod1 through its own service: got %v", network, seen)
		}
		if strings.HasPrefix(src, podIP(1).String()+":") {
			t.Errorf("%s: hairpin traffic must be masqueraded, pod saw its own address %s", network, src)
		}
	}
}

func TestIncrementalUpdateTouchesOnlyChangedService(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	a := service("a", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
		p.ClusterEndpoints = eps(8080, 1)
	})
	b := service("b", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.2")}
		p.ClusterEndpoints = eps(8080, 1, 2)
		p.Balancing = portal.BalancingMaglev // a chain of its own, with a counter
	})
	tp.sync(t, snapshot(a, b), true)
	ask(t, tp.pods[0], "tcp", "10.96.0.1:80", 5)
	ask(t, tp.pods[0], "tcp", "10.96.0.2:80", 7)
	before := portPackets(t, tp, "default/b:p/tcp/ipv4")
	if before == 0 {
		t.Fatalf("service b's counter did not count its traffic")
	}

	// Swap a's endpoint: pod1 -> pod2.
	a2 := service("a", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
		p.ClusterEndpoints = eps(8080, 2)
	})
	snap := snapshot(a2, b)
	snap.Dirty = []portal.ServiceKey{a2.Key}
	st := tp.sync(t, snap, false)
	t.Logf("incremental sync: %+v", st)
	if st.Full || st.Changed != 2 {
		t.Errorf("want an incremental sync changing 2 portals (tcp, udp), got %+v", st)
	}
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.1:80", 5); seen["pod2"] != 5 {
		t.Errorf("after the swap, a must reach pod2 only: %v", seen)
	}
	if after := portPackets(t, tp, "default/b:p/tcp/ipv4"); after != before {
		t.Errorf("service b's counter changed from %d to %d: its rules were rewritten", before, after)
	}

	// Deleting a removes its elements and chains; b keeps working.
	snap = snapshot(b)
	snap.Dirty = []portal.ServiceKey{a.Key}
	tp.sync(t, snap, false)
	if _, err := tp.pods[0].Ask("tcp", "10.96.0.1:80", time.Second); err == nil {
		t.Errorf("deleted service still answers")
	}
	ask(t, tp.pods[0], "tcp", "10.96.0.2:80", 2)
	d, err := tp.b.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Ports {
		if strings.HasPrefix(p.Service, "default/a:") {
			t.Errorf("deleted service left %s in the kernel", p.Service)
		}
	}
}

func portPackets(t *testing.T, tp *topo, svc string) uint64 {
	t.Helper()
	d, err := tp.b.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range d.Ports {
		if p.Service == svc {
			return p.Packets
		}
	}
	t.Fatalf("%s not in dump", svc)
	return 0
}

func TestOutsideChangesAreDetectedAndRepaired(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1)
	})
	snap := snapshot(web)
	tp.sync(t, snap, true)
	ctx := context.Background()
	if err := tp.b.Check(ctx); err != nil {
		t.Fatalf("check right after sync: %v", err)
	}
	other, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tb := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}

	// Someone flushes the dispatch chain.
	other.FlushChain(&nftables.Chain{Name: chainServices, Table: tb})
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := tp.b.Check(ctx); err == nil {
		t.Errorf("a flushed services chain went unnoticed")
	}
	tp.sync(t, snap, true)
	ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 1)

	// Someone deletes the table.
	other.DelTable(tb)
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := tp.b.Check(ctx); err == nil {
		t.Errorf("a deleted table went unnoticed")
	}
	tp.sync(t, snap, true)
	ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 1)

	// Someone else's table is never touched, by sync or cleanup.
	theirs := other.AddTable(&nftables.Table{Name: "theirs", Family: nftables.TableFamilyINet})
	other.AddChain(&nftables.Chain{Name: "keep", Table: theirs})
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	tp.sync(t, snap, true)
	if err := tp.b.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ListChain(theirs, "keep"); err != nil {
		t.Errorf("another table's chain was touched: %v", err)
	}
	if _, err := other.ListTableOfFamily(TableName, nftables.TableFamilyINet); err == nil {
		t.Errorf("cleanup left the onehop table")
	}
}

func TestGoldenRuleset(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 0)
	tp.sync(t, goldenSnapshot(), true)
	d, err := tp.b.Dump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	if err := d.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	golden(t, "ruleset.golden", d.Raw)
	golden(t, "dump.golden", table.String())
}

// goldenSnapshot holds the Services of testdata/ruleset.golden.
func goldenSnapshot() *portal.Snapshot {
	key := func(n string) portal.ServiceKey { return portal.ServiceKey{Namespace: "demo", Name: n} }
	one := &portal.Service{Key: key("web"), Portals: []*portal.Portal{
		{Key: portal.PortKey{Service: key("web"), Port: "http", Protocol: portal.TCP, Family: portal.IPv4}, Port: 80,
			ClusterIPs: []netip.Addr{clusterIP}, NodePort: 30080, ExternalIPs: []netip.Addr{extIP}, LoadBalancerIPs: []netip.Addr{lbIP},
			ClusterEndpoints: eps(8080, 1, 2), Hairpin: []netip.Addr{podIP(1)}},
		{Key: portal.PortKey{Service: key("web"), Port: "http", Protocol: portal.TCP, Family: portal.IPv6}, Port: 80,
			ClusterIPs:       []netip.Addr{netip.MustParseAddr("fd00:96::10")},
			ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("[fd00:244:1::2]:8080")}},
	}}
	dns := &portal.Service{Key: key("dns"), Portals: []*portal.Portal{
		{Key: portal.PortKey{Service: key("dns"), Port: "dns", Protocol: portal.UDP, Family: portal.IPv4}, Port: 53,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")}, ClusterEndpoints: eps(53, 3)},
		{Key: portal.PortKey{Service: key("dns"), Port: "dns-sctp", Protocol: portal.SCTP, Family: portal.IPv4}, Port: 53,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.53")}},
	}}
	return snapshot(one, dns)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the kernel's state (go test -update rewrites it):\n--- got\n%s", path, got)
	}
}

// A transaction the kernel rejects leaves the kernel as it was, and the
// next (full) sync repairs everything.
func TestRejectedTransactionIsAtomicAndRepaired(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	a := service("a", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.1")}
		p.ClusterEndpoints = eps(8080, 1)
	})
	b := service("b", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.2")}
		p.ClusterEndpoints = eps(8080, 1)
	})
	tp.sync(t, snapshot(a, b), true)
	// Someone else removes a's element: our next change to a fails (ENOENT).
	other, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tb := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	if err := other.SetDeleteElements(&nftables.Set{Table: tb, Name: setFlatGate(portal.IPv4)},
		[]nftables.SetElement{{Key: vipKey(netip.MustParseAddr("10.96.0.1"), portal.TCP, 80)}}); err != nil {
		t.Fatal(err)
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	b2 := service("b", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.2")}
		p.ClusterEndpoints = eps(8080, 0)
	})
	snap := snapshot(b2) // a deleted, b changed, in one transaction
	snap.Dirty = []portal.ServiceKey{a.Key, b.Key}
	if _, err := tp.b.Sync(context.Background(), snap, false); err == nil {
		t.Fatalf("the kernel accepted deleting an element that is gone")
	} else {
		t.Logf("rejected as expected: %v", err)
	}
	// Nothing of the failed transaction was applied: b still goes to pod1.
	if seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.2:80", 3); seen["pod1"] != 3 {
		t.Errorf("half-applied transaction: b reached %v", seen)
	}
	// The next sync is full and brings everything in line.
	st := tp.sync(t, snap, false)
	if !st.Full {
		t.Errorf("the sync after a failure must be full: %+v", st)
	}
	if seen, _ := ask(t, tp.pods[1], "tcp", "10.96.0.2:80", 3); seen["pod0"] != 3 {
		t.Errorf("after repair b must reach pod0: %v", seen)
	}
	mustDrop(t, tp.pods[0], "udp", "10.96.0.1:80")
}

// Whoever debugs with the nft tool must be able to list the table.
func TestNftToolListsTheTable(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("the nft tool (Debian package nftables) is not installed")
	}
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
		p.ClusterEndpoints = eps(8080, 1, 2)
		p.Affinity.TimeoutSeconds = 30
	})
	plain := service("plain", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		p.ClusterEndpoints = eps(8080, 0, 1, 2)
	})
	tp.sync(t, snapshot(plain), true)
	if out, err := tp.node.Exec("nft", "list", "table", "inet", TableName); err != nil {
		t.Errorf("without affinity: nft list table: %v\n%s", err, out)
	}
	tp.sync(t, snapshot(web, plain), true)
	ask(t, tp.pods[0], "tcp", "10.96.0.10:80", 1)
	out, err := tp.node.Exec("nft", "list", "table", "inet", TableName)
	if err != nil {
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	for _, want := range []string{"chain services", "10.96.0.10 . tcp . 80", "10.244.2.2 . 8080"} {
		if !strings.Contains(out, want) {
			t.Errorf("nft list table lacks %q:\n%s", want, out)
		}
	}
}
