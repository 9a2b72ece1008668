package external

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/config"
)

// upstreamRoutes makes the lab's BIRD send the nodes routes of its own,
// as a top-of-rack router that exports its table does: few host routes
// in 10.200.0.0/16 at once, and many more once the static protocol "many"
// is enabled (birdc enable many). They stay out of the router's kernel.
// BIRD keeps what the nodes send it and its filter refuses, so that
// `show route filtered` lists it.
func (lab *bgpLab) upstreamRoutes(t *testing.T, few, many int) {
	t.Helper()
	lab.reconfigure(t, [][2]string{
		{"protocol kernel { ipv4 { import none; export all; };", "protocol kernel { ipv4 { import none; export where source = RTS_BGP; };"},
		{"reject; }; export none; };", `reject; }; import keep filtered on; export where proto = "few" || proto = "many"; };`},
	}, staticRoutes("few", netip.MustParseAddr("10.200.0.0"), few, false)+
		staticRoutes("many", netip.MustParseAddr("10.200.128.0"), many, true))
}

// reconfigure replaces, in the lab's BIRD configuration, each first
// string of changes (which must be there) by the second, appends extra,
// and reloads BIRD.
func (lab *bgpLab) reconfigure(t *testing.T, changes [][2]string, extra string) {
	t.Helper()
	conf := filepath.Join(lab.dir, "bird.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, r := range changes {
		if !strings.Contains(s, r[0]) {
			t.Fatalf("the lab's BIRD configuration has no %q", r[0])
		}
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	if err := os.WriteFile(conf, []byte(s+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	var out string
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		time.Sleep(20 * time.Millisecond) // BIRD may not listen yet
		out = lab.birdc("configure")
		return strings.Contains(out, "Reconfigur")
	}); !ok {
		t.Fatalf("birdc configure: %s", out)
	}
}

// runBird runs BIRD in namespace n on configuration conf, with its
// control socket at ctl, until the test ends (startLogged).
func (tp *topo) runBird(n, conf, ctl, what string) {
	tp.startLogged(tp.command(n, "bird", "-f", "-c", conf, "-s", ctl), what)
}

// startLogged starts cmd, which is killed when the test ends; then each
// of checks reads its output, which is shown, as what's, when the test
// failed.
func (tp *topo) startLogged(cmd *exec.Cmd, what string, checks ...func(output string)) {
	t := tp.t
	logb := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logb, logb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for _, check := range checks {
			check(logb.String())
		}
		if t.Failed() {
			t.Logf("%s:\n%s", what, logb.String())
		}
	})
}

// staticRoutes is a BIRD static protocol of n unreachable host routes
// from first on.
func staticRoutes(name string, first netip.Addr, n int, disabled bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "protocol static %s {\n", name)
	if disabled {
		b.WriteString("  disabled yes;\n")
	}
	b.WriteString("  ipv4;\n")
	for a, i := first, 0; i < n; a, i = a.Next(), i+1 {
		fmt.Fprintf(&b, "  route %s/32 unreachable;\n", a)
	}
	b.WriteString("}\n")
	return b.String()
}

var exportedRE = regexp.MustCompile(`(\d+) exported`)

// exported is how many routes BIRD (at control socket ctl, in namespace
// ns) sends over its session named proto now, -1 when it cannot tell.
func (lab *bgpLab) exported(ns, ctl, proto string) int {
	out, _ := lab.command(ns, "birdc", "-s", ctl, "show", "protocols", "all", proto).CombinedOutput()
	m := exportedRE.FindSubmatch(out)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// learnedLine answers a speaker helper's "learned" command: what the
// speaker holds of its peers' routes, and the helper's heap once
// collected.
func learnedLine(sp *bgp.Speaker) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := sp.Learned(ctx)
	if err != nil {
		return "err " + err.Error()
	}
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return fmt.Sprintf("learned %d %d %d", l.Received, l.Accepted, ms.HeapAlloc)
}

// learned asks the speaker helper what it holds of its peers' routes
// (bgp.Speaker.Learned) and how large its heap is.
func (s *speaker) learned() (l bgp.Learned, heap uint64) {
	s.t.Helper()
	fmt.Fprintln(s.in, "learned")
	if !s.out.Scan() {
		s.t.Fatalf("speaker learned: no answer\n%s", s.stderr)
	}
	if _, err := fmt.Sscanf(s.out.Text(), "learned %d %d %d", &l.Received, &l.Accepted, &heap); err != nil {
		s.t.Fatalf("speaker learned: %q", s.out.Text())
	}
	return l, heap
}

// TestBGPPolicyImportsNothing: the lab's BIRD, standing for a top-of-rack
// router, sends node1's speaker routes of its own. A hundred are received
// and none is taken into the speaker's RIB, while its route to the VIP
// stays; ten thousand exceed the peer's prefix limit (set to 1000), and the speaker
// ends the session (BIRD reads "Maximum number of prefixes reached")
// and holds none of them: its heap is where it was before they came.
// Once the router sends fewer, the speaker's next try (PrefixLimitRestart
// later) brings the session and the node's route back.
func TestBGPPolicyImportsNothing(t *testing.T) {
	const few, many = 100, 9900
	lab := newBGPLab(t)
	lab.upstreamRoutes(t, few, many)
	ctl := filepath.Join(lab.dir, "bird.ctl")
	cfg := speakerConfig()
	cfg.Peers[0].MaxPrefixes = 1000 // the default is 100 times that: ten thousand routes stand for a full table
	n1 := lab.startSpeaker("node1", "10.0.0.11", cfg)
	n1.set(vip)
	lab.waitHops(t, "node1 announces", "10.0.0.11")

	var l bgp.Learned
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond)
		l, _ = n1.learned()
		return lab.exported("router", ctl, "node1") == few && l.Received == few
	}); !ok {
		t.Fatalf("BIRD sent %d routes, node1 received %d; want %d\n%s", lab.exported("router", ctl, "node1"), l.Received, few,
			lab.birdc("show", "protocols", "all", "node1"))
	}
	if l.Accepted != 0 {
		t.Errorf("node1 took %d of the router's %d routes into its RIB; want none", l.Accepted, few)
	}
	lab.waitHops(t, "node1 announces beside the routes it refuses", "10.0.0.11")
	_, heap0 := n1.learned()

	if out := lab.birdc("enable", "many"); !strings.Contains(out, "enabled") {
		t.Fatalf("birdc enable many: %s", out)
	}
	total := few + many
	cut := func() bool {
		return strings.Contains(lab.birdc("show", "protocols", "all", "node1"), "Maximum number of prefixes")
	}
	if _, ok := waitFor(context.Background(), 60*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond)
		l, _ = n1.learned()
		return cut() || l.Received == total
	}); !ok || !cut() {
		t.Fatalf("BIRD sent %d routes; node1 holds %d of them (%d in its RIB) and its session stays; want it cut at the prefix limit\n%s",
			total, l.Received, l.Accepted, lab.birdc("show", "protocols", "all", "node1"))
	}
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond)
		l, _ = n1.learned()
		return l == bgp.Learned{}
	}); !ok {
		t.Fatalf("after the cut node1 still holds %+v of the router's routes", l)
	}
	_, heap1 := n1.learned()
	grew := int64(heap1) - int64(heap0)
	t.Logf("node1's heap %d bytes with %d routes refused, %d after %d more ended the session: %+d bytes",
		heap0, few, heap1, many, grew)
	if grew > 1<<20 {
		t.Errorf("node1's heap grew by %d bytes with the router's %d routes; want it where it was", grew, total)
	}
	// The cut session carries no route of the node either: the router
	// has none to the VIP now.
	lab.waitHops(t, "the session was cut")

	// Once the router sends fewer routes again, the speaker's next try
	// brings the session back.
	if out := lab.birdc("disable", "many"); !strings.Contains(out, "disabled") {
		t.Fatalf("birdc disable many: %s", out)
	}
	t0 := time.Now()
	if _, ok := waitFor(context.Background(), bgp.PrefixLimitRestart+30*time.Second, func() bool {
		time.Sleep(100 * time.Millisecond)
		return slices.Equal(lab.nextHopsFor(vip), []string{"10.0.0.11"})
	}); !ok {
		t.Fatalf("the session did not come back after the router sent fewer routes:\n%s", lab.birdc("show", "protocols", "all", "node1"))
	}
	t.Logf("session back %v after the router sent fewer routes (retry after %v)", time.Since(t0).Round(time.Second), bgp.PrefixLimitRestart)
	l, _ = n1.learned()
	if l.Accepted != 0 {
		t.Errorf("node1 took %d of the router's routes into its RIB after the session came back; want none", l.Accepted)
	}
}

// addSecondRouter adds the namespace "router2" at secondRouter on the
// nodes' bridge, and returns where its BIRD's configuration and control
// socket go.
func (lab *bgpLab) addSecondRouter() (conf, ctl string) {
	lab.add("router2")
	lab.veth("router", "vr2", "router2", "eth0")
	lab.ip("router", "link", "set", "vr2", "master", "br0")
	lab.ip("router2", "addr", "add", secondRouter+"/24", "dev", "eth0")
	return filepath.Join(lab.dir, "bird2.conf"), filepath.Join(lab.dir, "bird2.ctl")
}

// startThirdPartyRouter runs a second upstream router, of its own AS
// 64514, at secondRouter on the nodes' bridge. It peers with both nodes,
// sends them routes of its own (10.201.0.0/24) and keeps whatever they
// send it. It returns its control socket.
func (lab *bgpLab) startThirdPartyRouter(t *testing.T, routes int) string {
	t.Helper()
	conf, ctl := lab.addSecondRouter()
	s := `router id ` + secondRouter + `;
protocol device { scan time 10; }
template bgp nodes { local ` + secondRouter + ` as 64514; passive yes;
  hold time 9; keepalive time 3; connect retry time 1; error wait time 1,5;
  ipv4 { import all; export where proto = "own"; }; }
protocol bgp node1 from nodes { neighbor 10.0.0.11 as 64513; }
protocol bgp node2 from nodes { neighbor 10.0.0.12 as 64513; }
` + staticRoutes("own", netip.MustParseAddr("10.201.0.0"), routes, false)
	if err := os.WriteFile(conf, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	lab.runBird("router2", conf, ctl, "second router's bird")
	return ctl
}

var birdViaRE = regexp.MustCompile(`via (10\.0\.0\.\d+)`)

// birdRoutes is what BIRD (control socket ctl in namespace ns) holds with
// args (e.g. "filtered"): the next hops of each prefix.
func (lab *bgpLab) birdRoutes(ns, ctl string, args ...string) map[string][]string {
	out, _ := lab.command(ns, append([]string{"birdc", "-s", ctl, "show", "route"}, args...)...).CombinedOutput()
	routes := map[string][]string{}
	pfx := ""
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "/") {
			pfx = f[0]
		}
		if m := birdViaRE.FindStringSubmatch(line); m != nil && pfx != "" {
			routes[pfx] = append(routes[pfx], m[1])
			slices.Sort(routes[pfx])
		}
	}
	return routes
}

// within are the prefixes of routes inside p.
func within(routes map[string][]string, p netip.Prefix) []string {
	var out []string
	for s := range routes {
		if q, err := netip.ParsePrefix(s); err == nil && p.Overlaps(q) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// TestBGPPolicyNoTransit: a split install whose nodes peer with two
// upstream routers of different ASes, each sending the nodes routes of
// its own. The Services' addresses reach both routers from both nodes;
// no route of one router reaches the other through a node: a node is no
// transit path.
func TestBGPPolicyNoTransit(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	lab.upstreamRoutes(t, 100, 0)
	ctl1 := filepath.Join(lab.dir, "bird.ctl")
	ctl2 := lab.startThirdPartyRouter(t, 50)

	t.Setenv("OHX_MODEL", "1") // the agents serve what their own model programs: both Services
	sp := newSplit(t, cp)
	const vip2 = "203.0.113.11"
	sp.runAll(lab.topo, sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip, vip2}}},
		BGP: &bgp.Config{ASN: 64513, Peers: []bgp.Peer{
			{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9},
			{Address: secondRouter, ASN: 64514, HoldTimeSeconds: 9},
		}},
	}))
	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	both := map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"}
	createLB(t, c, "web", 80, local)
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", both)
	lab.waitHops(t, "the first router learns the Service from both nodes", "10.0.0.11", "10.0.0.12")
	secondHops := func(ip string) []string { return lab.birdRoutes("router2", ctl2)[ip+"/32"] }
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond)
		return slices.Equal(secondHops(vip), []string{"10.0.0.11", "10.0.0.12"})
	}); !ok {
		t.Fatalf("the second router has %s via %v; want both nodes\n%s", vip, secondHops(vip), lab.birdc("show", "protocols", "all"))
	}

	// Each router has sent each node all its routes.
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond)
		for _, n := range []string{"node1", "node2"} {
			if lab.exported("router", ctl1, n) != 100 || lab.exported("router2", ctl2, n) != 50 {
				return false
			}
		}
		return true
	}); !ok {
		t.Fatalf("the routers did not send the nodes their routes:\n%s", lab.birdc("show", "protocols", "all"))
	}
	// A second Service, announced after that, marks that the nodes have
	// sent the routers what they were going to.
	createLB(t, c, "web2", 80, local)
	if ips := lbIPs(t, c, "web2", "allocation", some); ips[0] != vip2 {
		t.Fatalf("web2 got %v, want %s", ips, vip2)
	}
	setEndpoints(t, c, "web2", both)
	lab.waitHopsFor(t, vip2, "the first router learns the second Service", "10.0.0.11", "10.0.0.12")
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		time.Sleep(50 * time.Millisecond)
		return slices.Equal(secondHops(vip2), []string{"10.0.0.11", "10.0.0.12"})
	}); !ok {
		t.Fatalf("the second router has %s via %v; want both nodes", vip2, secondHops(vip2))
	}

	if leaked := within(lab.birdRoutes("router2", ctl2), netip.MustParsePrefix("10.200.0.0/16")); len(leaked) > 0 {
		t.Errorf("the second router learned %d of the first router's routes through the nodes, e.g. %s", len(leaked), leaked[0])
	}
	// The first router keeps what its filter refuses: the second's routes
	// must not be among it either.
	if leaked := within(lab.birdRoutes("router", ctl1, "filtered"), netip.MustParsePrefix("10.201.0.0/16")); len(leaked) > 0 {
		t.Errorf("the first router was sent %d of the second router's routes through the nodes, e.g. %s", len(leaked), leaked[0])
	}
	t.Logf("the second router holds %d routes, the Services' %v", len(lab.birdRoutes("router2", ctl2)),
		within(lab.birdRoutes("router2", ctl2), netip.MustParsePrefix("203.0.113.0/24")))
}
