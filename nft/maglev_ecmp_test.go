package nft

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// The ECMP lab: a router that also is the client, two nodes it learns a
// load-balancer IP from over BGP (BIRD on all three), and pods on one L2
// segment that both nodes reach. The pods' default gateway is node A.
//
//	router/client 10.0.0.1 (br0) --- node A 10.0.0.11, node B 10.0.0.12
//	node A 10.244.0.1, node B 10.244.0.254 --- podnet br0 --- pod i 10.244.0.(10+i)
const (
	ecmpVIP     = "203.0.113.10"
	ecmpRouter  = "10.0.0.1"
	ecmpNodeA   = "10.0.0.11"
	ecmpNodeB   = "10.0.0.12"
	ecmpPodGW   = "10.244.0.1"
	ecmpPodGWB  = "10.244.0.254"
	ecmpPods    = 3
	ecmpFlows   = 16
	ecmpASRoute = 64512
	ecmpASNodes = 64513
)

func ecmpPodIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, 0, byte(10 + i)}) }

type ecmpLab struct {
	router, a, b *nsutil.NS
	dir          string
}

func requireTool(t *testing.T, tool, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("needs %s on PATH (Debian package %s)", tool, pkg)
	}
}

func newECMPLab(t *testing.T) *ecmpLab {
	t.Helper()
	nsutil.RequireRoot(t)
	requireTool(t, "bird", "bird2")
	requireTool(t, "birdc", "bird2")
	lab := &ecmpLab{router: nsutil.New(t, "ohmr-"), a: nsutil.New(t, "ohma-"), b: nsutil.New(t, "ohmb-"), dir: t.TempDir()}
	podnet := nsutil.New(t, "ohmp-")
	lab.router.IP(t, "link", "add", "br0", "type", "bridge")
	lab.router.IP(t, "addr", "add", ecmpRouter+"/24", "dev", "br0")
	lab.router.IP(t, "link", "set", "br0", "up")
	lab.router.Sysctl(t, "net.ipv4.fib_multipath_hash_policy", "1") // by 5-tuple: flows split between the nodes
	podnet.IP(t, "link", "add", "br0", "type", "bridge")
	podnet.IP(t, "link", "set", "br0", "up")
	for _, n := range []struct {
		ns          *nsutil.NS
		up, pod, br string
	}{{lab.a, ecmpNodeA, ecmpPodGW, "node-a"}, {lab.b, ecmpNodeB, ecmpPodGWB, "node-b"}} {
		nsutil.Veth(t, n.ns, "uplink", []string{n.up + "/24"}, lab.router, "to-"+n.br, nil)
		lab.router.IP(t, "link", "set", "to-"+n.br, "master", "br0")
		nsutil.Veth(t, n.ns, "pods", []string{n.pod + "/24"}, podnet, n.br, nil)
		podnet.IP(t, "link", "set", n.br, "master", "br0")
		n.ns.Sysctl(t, "net.ipv4.ip_forward", "1")
	}
	for i := range ecmpPods {
		p := nsutil.New(t, "ohmq-")
		nsutil.Veth(t, p, "eth0", []string{ecmpPodIP(i).String() + "/24"}, podnet, fmt.Sprintf("p%d", i), nil)
		podnet.IP(t, "link", "set", fmt.Sprintf("p%d", i), "master", "br0")
		p.IP(t, "route", "add", "default", "via", ecmpPodGW)
		p.Echo(t, nsutil.PodName(i), fmt.Sprintf(":%d", nsutil.EchoPort))
	}
	lab.bird(t, lab.router, "router", fmt.Sprintf(`router id %s;
protocol device { scan time 10; }
protocol kernel { ipv4 { import none; export all; }; merge paths yes limit 16; learn no; }
template bgp nodes {
  local %s as %d; passive yes;
  hold time 9; keepalive time 3; connect retry time 1; error wait time 1,5;
  ipv4 { import filter { if net = %s/32 then accept; reject; }; export none; };
}
protocol bgp a from nodes { neighbor %s as %d; }
protocol bgp b from nodes { neighbor %s as %d; }
`, ecmpRouter, ecmpRouter, ecmpASRoute, ecmpVIP, ecmpNodeA, ecmpASNodes, ecmpNodeB, ecmpASNodes))
	return lab
}

// bird starts BIRD in ns with conf; its control socket is <dir>/<name>.ctl.
func (lab *ecmpLab) bird(t *testing.T, ns *nsutil.NS, name, conf string) {
	t.Helper()
	path := filepath.Join(lab.dir, name+".conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ns.Start(t, "bird "+name, nil, "bird", "-f", "-c", path, "-s", filepath.Join(lab.dir, name+".ctl"))
}

// announce starts the BGP speaker of a node: BIRD announcing the
// load-balancer IP with the node as next hop.
func (lab *ecmpLab) announce(t *testing.T, ns *nsutil.NS, name, addr string) {
	t.Helper()
	lab.bird(t, ns, name, fmt.Sprintf(`router id %s;
protocol device { scan time 10; }
protocol static vip { ipv4; route %s/32 blackhole; }
protocol bgp up {
  local %s as %d; neighbor %s as %d;
  hold time 9; keepalive time 3; connect retry time 1; error wait time 1,5;
  ipv4 { import none; export where proto = "vip"; next hop self; };
}
`, addr, ecmpVIP, addr, ecmpASNodes, ecmpRouter, ecmpASRoute))
}

func (lab *ecmpLab) birdc(t *testing.T, ns *nsutil.NS, name string, args ...string) string {
	t.Helper()
	out, err := ns.Exec("birdc", append([]string{"-s", filepath.Join(lab.dir, name+".ctl")}, args...)...)
	if err != nil {
		t.Fatalf("birdc %v: %v\n%s", args, err, out)
	}
	return out
}

var ecmpVia = regexp.MustCompile(`via ([0-9.]+)`)

// waitHops waits until the router's kernel routes the load-balancer IP
// through exactly the next hops want.
func (lab *ecmpLab) waitHops(t *testing.T, want ...string) {
	t.Helper()
	var got []string
	for range 600 {
		out, _ := lab.router.Exec("ip", "route", "show", "exact", ecmpVIP+"/32")
		got = got[:0]
		for _, m := range ecmpVia.FindAllStringSubmatch(out, -1) {
			got = append(got, m[1])
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the router's next hops for %s are %v, want %v", ecmpVIP, got, want)
}

// ecmpService is the Service behind the load-balancer IP on both nodes:
// externalTrafficPolicy Local, so that the pods see the client's address
// (no masquerade), with every pod local to both nodes (one L2 segment).
func ecmpService(order []int) *portal.Service {
	key := portal.ServiceKey{Namespace: "demo", Name: "ecmp"}
	var eps []netip.AddrPort
	for _, i := range order {
		eps = append(eps, netip.AddrPortFrom(ecmpPodIP(i), nsutil.EchoPort))
	}
	return &portal.Service{Key: key, Portals: []*portal.Portal{{
		Key:  portal.PortKey{Service: key, Port: "http", Protocol: portal.TCP, Family: portal.IPv4},
		Port: 80, ClusterIPs: []netip.Addr{clusterIP}, LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(ecmpVIP)},
		ExternalLocal: true, ClusterEndpoints: eps, LocalEndpoints: eps, Hairpin: []netip.Addr{},
		Balancing: portal.BalancingMaglev,
	}}}
}

func (lab *ecmpLab) program(t *testing.T, ns *nsutil.NS, order []int) {
	t.Helper()
	be := New(dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, WithNetNS(ns.FD()))
	t.Cleanup(func() { _ = be.Cleanup(context.Background()) })
	snap := &portal.Snapshot{Node: portal.Node{Name: ns.Name}, Services: map[portal.ServiceKey]*portal.Service{}}
	svc := ecmpService(order)
	snap.Services[svc.Key], snap.Dirty = svc, []portal.ServiceKey{svc.Key}
	if _, err := be.Sync(context.Background(), snap, true); err != nil {
		t.Fatal(err)
	}
}

// flowsTo counts the conntrack entries of a node for connections to the
// load-balancer IP.
func flowsTo(t *testing.T, ns *nsutil.NS) int {
	t.Helper()
	h, err := nsHandle(ns.FD())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Forward.DstIP.String() == ecmpVIP && f.Forward.Protocol == unix.IPPROTO_TCP {
			n++
		}
	}
	return n
}

// Long-lived TCP connections survive the router moving them to another
// node. They start through node A, the pods' gateway; node B joins the
// BGP set (ECMP sends some of them through B), then A leaves it (all go
// through B). B picks each connection's pod from the same Maglev table, so
// the pod sees the same packets from the same client address and port;
// its replies go to A, whose conntrack entry turns them back into the
// load-balancer IP's. With a random pick, B would send most connections
// to another pod, which answers with a reset.
//
// What it takes besides Maglev: no masquerade (here externalTrafficPolicy
// Local, every pod local to both nodes on one L2 segment), replies
// returning through the node that first translated the connection while
// its conntrack entry lives, and that node tracking TCP liberally
// (nf_conntrack_tcp_be_liberal): once the client's packets take the other
// path it sees only the replies, acknowledging data it never saw, which
// window tracking marks invalid and leaves untranslated.
func TestMaglevConnectionSurvivesECMPMove(t *testing.T) {
	t.Parallel()
	lab := newECMPLab(t)
	lab.a.Sysctl(t, "net.netfilter.nf_conntrack_tcp_be_liberal", "1")
	lab.program(t, lab.a, []int{0, 1, 2})
	lab.program(t, lab.b, []int{2, 0, 1})
	lab.announce(t, lab.a, "a", ecmpNodeA)
	lab.waitHops(t, ecmpNodeA)

	ctx := context.Background()
	addr := ecmpVIP + ":80"
	type flow struct {
		c        *nsutil.EchoConn
		pod, src string
	}
	var flows []flow
	for range ecmpFlows {
		c, err := nsutil.DialEcho(ctx, lab.router.Name, addr)
		if err != nil {
			t.Fatalf("connecting through node A: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		r, err := c.Ask(ctx)
		if err != nil {
			t.Fatalf("first request through node A: %v", err)
		}
		if r.SourceIP() != ecmpRouter {
			t.Fatalf("the pod saw %s, want the client's own address %s (no masquerade)", r.Source, ecmpRouter)
		}
		flows = append(flows, flow{c, r.Name, r.Source})
	}
	pods := map[string]int{}
	for _, f := range flows {
		pods[f.pod]++
	}
	check := func(stage string) {
		t.Helper()
		for i, f := range flows {
			r, err := f.c.Ask(ctx)
			if err != nil {
				t.Fatalf("%s: connection %d (to %s) broke: %v", stage, i, f.pod, err)
			}
			if r.Name != f.pod || r.Source != f.src {
				t.Fatalf("%s: connection %d reached %s seen from %s, want %s seen from %s", stage, i, r.Name, r.Source, f.pod, f.src)
			}
		}
	}

	lab.announce(t, lab.b, "b", ecmpNodeB)
	lab.waitHops(t, ecmpNodeA, ecmpNodeB)
	check("node B joined")
	viaB := flowsTo(t, lab.b)
	t.Logf("%d connections to pods %v; with both nodes in the BGP set, %d of them go through node B", ecmpFlows, pods, viaB)

	lab.birdc(t, lab.a, "a", "disable", "up")
	lab.waitHops(t, ecmpNodeB)
	check("node A left")
	if n := flowsTo(t, lab.b); n != ecmpFlows {
		t.Errorf("node B tracks %d connections to %s, want all %d: they did not move", n, ecmpVIP, ecmpFlows)
	}
	t.Logf("node A left the BGP set: all %d connections go through node B and still reach their pods", ecmpFlows)
}
