package nft

import (
	"net/netip"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// policiesSnapshot has one Service port of each shape the backend renders:
// every way in with two endpoints, Local external policy behind source
// ranges with ClientIP affinity, Local internal policy with and without a
// local endpoint, and a pod external IP.
func policiesSnapshot() *portal.Snapshot {
	key := func(n string) portal.ServiceKey { return portal.ServiceKey{Namespace: "demo", Name: n} }
	pk := func(s, port string, p portal.Protocol, f portal.Family) portal.PortKey {
		return portal.PortKey{Service: key(s), Port: port, Protocol: p, Family: f}
	}
	web := &portal.Service{Key: key("web"), Portals: []*portal.Portal{
		{Key: pk("web", "http", portal.TCP, portal.IPv4), Port: 80,
			ClusterIPs: []netip.Addr{clusterIP}, NodePort: 30080, ExternalIPs: []netip.Addr{extIP}, LoadBalancerIPs: []netip.Addr{lbIP},
			ClusterEndpoints: eps(8080, 1, 2)},
		{Key: pk("web", "http", portal.TCP, portal.IPv6), Port: 80, ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:96::10")},
			ClusterEndpoints: []netip.AddrPort{netip.AddrPortFrom(podIP6(1), 8080), netip.AddrPortFrom(podIP6(2), 8080)}},
	}}
	sticky := &portal.Service{Key: key("sticky"), Portals: []*portal.Portal{
		{Key: pk("sticky", "", portal.TCP, portal.IPv4), Port: 443,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")}, NodePort: 30443,
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.20")},
			// Ranges that overlap, touch, reach the last address and hold one address.
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("198.51.100.0/25"),
				netip.MustParsePrefix("198.51.100.64/26"), netip.MustParsePrefix("198.51.100.128/26"), netip.MustParsePrefix("255.255.255.0/24")},
			ExternalLocal:    true,
			ClusterEndpoints: eps(8080, 0, 1, 2), LocalEndpoints: eps(8080, 0, 1), Hairpin: []netip.Addr{podIP(0), podIP(1)}, Affinity: portal.Affinity{TimeoutSeconds: 600}},
		{Key: pk("sticky", "", portal.UDP, portal.IPv6), Port: 53,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:96::20")}, InternalLocal: true,
			ClusterEndpoints: []netip.AddrPort{netip.MustParseAddrPort("[fd00:244:1::2]:53")}},
	}}
	itp := &portal.Service{Key: key("itp"), Portals: []*portal.Portal{
		{Key: pk("itp", "x", portal.TCP, portal.IPv4), Port: 81, NodePort: 30081,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.30")}, InternalLocal: true,
			ClusterEndpoints: eps(8080, 1, 2), LocalEndpoints: eps(8080, 1), Hairpin: []netip.Addr{podIP(1)}, Affinity: portal.Affinity{TimeoutSeconds: 300}},
	}}
	s := snapshot(web, sticky, itp)
	s.Node.PodExternalIPs = []portal.PodExternalIP{{External: netip.MustParseAddr("203.0.113.50"), Pod: podIP(5), Name: key("pod5")}}
	return s
}

// requireNft skips t when the nft binary is missing and returns its version.
func requireNft(t *testing.T) string {
	t.Helper()
	nsutil.RequireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft command (Debian package nftables, installed by hack/ci-deps.sh) to check the rendering against")
	}
	out, _ := exec.Command("nft", "--version").CombinedOutput()
	return strings.TrimSpace(string(out))
}

// TestRulesetTextMatchesNft renders a table holding every kind of object
// the backend creates and compares it with what nft prints for the same
// kernel state, before and after traffic (counters, clients remembered for
// affinity). It also keeps testdata/ruleset-policies.golden, and
// dump-policies.golden for the per-Service view of the same table.
func TestRulesetTextMatchesNft(t *testing.T) {
	t.Parallel()
	version := requireNft(t)
	tp := newTopo(t, 3)
	tp.sync(t, policiesSnapshot(), true)
	k := readTable(t, tp)
	golden(t, "ruleset-policies.golden", k.render())
	var table strings.Builder
	if err := k.dump().WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	golden(t, "dump-policies.golden", table.String())
	for _, want := range []string{
		"ip daddr . meta l4proto . th dport vmap @vips4",
		`10.96.0.20 . tcp . 443 comment "cluster-ip svc4/demo/sticky/tcp/_" : goto svc4/demo/sticky/tcp/_`,
		`10.96.0.10 . tcp . 80 . 1 comment "cluster-ip svc4/demo/web/tcp/http" : 10.244.3.2 . 8080`,
		"ip daddr . meta l4proto . th dport @flat-vips4 goto flat4",
		"dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @flat4-02",
		"ct state new jump noep-check",
		"numgen random mod 3 vmap {",
		"update @aff4/demo/sticky/tcp/_@10.244.1.2:8080 {",
		"ip saddr @aff4/demo/itp/tcp/x@10.244.2.2:8080 goto aep4/demo/itp/tcp/x@10.244.2.2:8080",
		"snat ip to ip saddr map @pod-snat4",
		"dnat ip to 10.244.2.2:8080",
	} {
		if !strings.Contains(k.render(), want) {
			t.Errorf("the rendering lacks %q", want)
		}
	}
	compareWithNft(t, tp, k, version)

	// A client remembered for affinity, and counters that moved.
	if _, err := tp.client.Ask("tcp", "10.96.0.20:443", 2*time.Second); err != nil {
		t.Fatalf("request to the affinity Service: %v", err)
	}
	k = readTable(t, tp)
	if !regexp.MustCompile(`elements = \{ ` + regexp.QuoteMeta(clientIP) + ` expires \w+`).MatchString(k.render()) {
		t.Errorf("the client is not shown in its affinity set:\n%s", k.render())
	}
	if !strings.Contains(k.render(), "counter packets 1 ") {
		t.Errorf("no counter shows the request:\n%s", k.render())
	}
	compareWithNft(t, tp, k, version)
}

// TestGoldenRulesetMatchesNft proves testdata/ruleset.golden is what nft
// prints: it syncs the golden test's Services and compares.
func TestGoldenRulesetMatchesNft(t *testing.T) {
	t.Parallel()
	version := requireNft(t)
	tp := newTopo(t, 0)
	tp.sync(t, goldenSnapshot(), true)
	compareWithNft(t, tp, readTable(t, tp), version)
}

func readTable(t *testing.T, tp *topo) *kernelTable {
	t.Helper()
	k, err := readKernel(tp.node.FD(), tp.b.table)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// compareWithNft checks both renderings against `nft list table`: the full
// one line for line, the one for people (golden files, dump-rules) with
// nft's empty endpoint maps left out.
func compareWithNft(t *testing.T, tp *topo, k *kernelTable, version string) {
	t.Helper()
	out, err := tp.node.Exec("nft", "list", "table", "inet", TableName)
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	nft := normaliseNft(out)
	diffLines(t, "full rendering", normaliseNft(k.text(textOptions{})), nft, version)
	diffLines(t, "rendering for people", normaliseNft(k.render()), dropEmptyShards(nft), version)
}

func diffLines(t *testing.T, what string, got, want []string, version string) {
	t.Helper()
	for i := 0; i < max(len(got), len(want)); i++ {
		g, w := "<end>", "<end>"
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("%s differs from `nft list table` (%s) at line %d:\n ours: %s\n  nft: %s\n--- ours, normalised:\n%s",
				what, version, i+1, g, w, strings.Join(got, "\n"))
			return
		}
	}
}

var (
	elementLists = regexp.MustCompile(`(elements = |vmap )\{([^{}]*)\}`)
	expires      = regexp.MustCompile(`expires [0-9dhms]+`)
)

// normaliseNft makes two listings of one table comparable: whitespace,
// the order of elements (the kernel's hash order for nft, by key for us),
// the remaining lifetime of elements and comment lines do not count.
func normaliseNft(s string) []string {
	s = expires.ReplaceAllString(s, "expires <t>")
	s = elementLists.ReplaceAllStringFunc(s, func(m string) string {
		sub := elementLists.FindStringSubmatch(m)
		var els []string
		for _, e := range strings.Split(sub[2], ",") {
			els = append(els, strings.Join(strings.Fields(e), " "))
		}
		sort.Strings(els)
		return sub[1] + "{\n" + strings.Join(els, ",\n") + "\n}"
	})
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.Join(strings.Fields(l), " ")
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// dropEmptyShards removes the empty endpoint and flat maps from a
// normalised listing.
func dropEmptyShards(lines []string) []string {
	var out []string
	for i := 0; i < len(lines); i++ {
		name, _, _ := strings.Cut(strings.TrimPrefix(lines[i], "map "), " ")
		if (strings.HasPrefix(lines[i], "map endpoints") || isFlatMap(name)) && i+2 < len(lines) && lines[i+2] == "}" {
			i += 2
			continue
		}
		out = append(out, lines[i])
	}
	return out
}

// An expression the renderer does not know is printed, not dropped, and so
// is a read of a register nothing loaded.
func TestRuleTextShowsWhatItCannotDecode(t *testing.T) {
	k := &kernelTable{elems: map[string][]nftables.SetElement{}}
	got := k.ruleText(&nftables.Rule{Exprs: []expr.Any{
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}},
		&expr.Log{},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	for _, want := range []string{"[reg 1: empty]", "[not decoded: *expr.Log", "accept"} {
		if !strings.Contains(got, want) {
			t.Errorf("rule text %q lacks %q", got, want)
		}
	}
}

// Pure formatting helpers against what nft prints.
func TestNftFormatting(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{nftDuration(10 * time.Minute), "10m"},
		{nftDuration(3*time.Hour + 2*time.Second + 5*time.Millisecond), "3h2s5ms"},
		{priorityText(-100, *nftables.ChainHookPrerouting), "dstnat"},
		{priorityText(-100, *nftables.ChainHookOutput), "-100"},
		{priorityText(-10, *nftables.ChainHookInput), "filter - 10"},
		{priorityText(100, *nftables.ChainHookPostrouting), "srcnat"},
		{valueText([]uint32{dtIPv4, dtInetProto, dtInetService}, vipKey(clusterIP, portal.SCTP, 53)), "10.96.0.10 . sctp . 53"},
		{valueText([]uint32{dtHostInteger, dtHostInteger}, epKey(7, 300)), "7 . 300"},
		{bitNames(8|2, ctStateBits), "established,new"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
