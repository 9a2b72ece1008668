package external

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/external/bgp"
)

const vip = "203.0.113.10"

// bgpLab: BIRD 2 in "router", speakers in node1/node2 on one bridge
// (10.0.0.0/24 and fd00::/64), a pod behind each node (10.244.N.2 and
// fd00:244:N::2, DNATed from the VIPs by an nft rule standing in for the
// dataplane), a client on its own link (10.1.0.0/24, fd00:1::/64).
type bgpLab struct {
	*topo
	dir string
}

func newBGPLab(t *testing.T) *bgpLab { return newBGPLabBFD(t, false) }

// newBGPLabBFD builds the lab; with bfd, BIRD runs BFD with the nodes.
func newBGPLabBFD(t *testing.T, bfd bool) *bgpLab {
	needs(t, "bird", "nft")
	lab := &bgpLab{topo: newTopo(t), dir: t.TempDir()}
	lab.add("router", "node1", "node2", "client", "pod1", "pod2")
	lab.ip("router", "link", "add", "br0", "type", "bridge")
	lab.ip("router", "addr", "add", "10.0.0.1/24", "dev", "br0")
	lab.ip("router", "-6", "addr", "add", "fd00::1/64", "dev", "br0", "nodad")
	lab.ip("router", "link", "set", "br0", "up")
	lab.exec("router", "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1",
		"net.ipv6.conf.all.forwarding=1", "net.ipv6.fib_multipath_hash_policy=1")
	lab.veth("router", "c0", "client", "eth0")
	lab.ip("router", "addr", "add", "10.1.0.1/24", "dev", "c0")
	lab.ip("router", "-6", "addr", "add", "fd00:1::1/64", "dev", "c0", "nodad")
	lab.ip("client", "addr", "add", "10.1.0.2/24", "dev", "eth0")
	lab.ip("client", "-6", "addr", "add", "fd00:1::2/64", "dev", "eth0", "nodad")
	lab.ip("client", "route", "add", "default", "via", "10.1.0.1")
	lab.ip("client", "-6", "route", "add", "default", "via", "fd00:1::1")
	for i := 1; i <= 2; i++ {
		node, pod := fmt.Sprintf("node%d", i), fmt.Sprintf("pod%d", i)
		lab.veth("router", "v"+node, node, "eth0")
		lab.ip("router", "link", "set", "v"+node, "master", "br0")
		lab.ip(node, "addr", "add", fmt.Sprintf("10.0.0.1%d/24", i), "dev", "eth0")
		lab.ip(node, "-6", "addr", "add", fmt.Sprintf("fd00::1%d/64", i), "dev", "eth0", "nodad")
		lab.ip(node, "route", "add", "10.1.0.0/24", "via", "10.0.0.1")
		lab.ip(node, "-6", "route", "add", "fd00:1::/64", "via", "fd00::1")
		lab.exec(node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
		lab.veth(node, "pod", pod, "eth0")
		lab.ip(node, "addr", "add", fmt.Sprintf("10.244.%d.1/24", i), "dev", "pod")
		lab.ip(node, "-6", "addr", "add", fmt.Sprintf("fd00:244:%d::1/64", i), "dev", "pod", "nodad")
		lab.ip(pod, "addr", "add", fmt.Sprintf("10.244.%d.2/24", i), "dev", "eth0")
		lab.ip(pod, "-6", "addr", "add", fmt.Sprintf("fd00:244:%d::2/64", i), "dev", "eth0", "nodad")
		lab.ip(pod, "route", "add", "default", "via", fmt.Sprintf("10.244.%d.1", i))
		lab.ip(pod, "-6", "route", "add", "default", "via", fmt.Sprintf("fd00:244:%d::1", i))
		rules := filepath.Join(lab.dir, node+".nft")
		os.WriteFile(rules, fmt.Appendf(nil, `table inet ohxtest {
 chain pre { type nat hook prerouting priority -100;
  ip daddr %s tcp dport 80 dnat ip to 10.244.%d.2:8080
  ip6 daddr %s tcp dport 80 dnat ip6 to [fd00:244:%d::2]:8080
 }
}
`, vip, i, vip6, i), 0o644)
		lab.exec(node, "nft", "-f", rules)
		lab.serve(pod, ":8080", pod)
	}
	lab.startBird(bfd)
	return lab
}

func (lab *bgpLab) startBird(bfd bool) {
	conf := filepath.Join(lab.dir, "bird.conf")
	bfdConf, bfdOn := "", "off"
	if bfd {
		bfdConf = `protocol bfd { interface "br0" { min rx interval 300 ms; min tx interval 300 ms; multiplier 3; }; }`
		bfdOn = "on"
	}
	os.WriteFile(conf, []byte(`router id 10.0.0.1;
protocol device { scan time 10; }
`+bfdConf+`
protocol kernel { ipv4 { import none; export all; }; merge paths yes limit 16; learn no; }
protocol kernel { ipv6 { import none; export all; }; merge paths yes limit 16; learn no; }
template bgp nodes {
  local 10.0.0.1 as 64512; passive yes;
  hold time 9; keepalive time 3; connect retry time 1;
  error wait time 1,5;
  bfd `+bfdOn+`;
  ipv4 { import filter { if net ~ [ 203.0.113.0/24{32,32} ] then accept; reject; }; export none; };
  # IPv6 routes ride the IPv4 session (MP-BGP, RFC 4760) with the nodes'
  # global IPv6 addresses as next hops; nothing is exported, so BIRD
  # needs no IPv6 next hop of its own.
  ipv6 { import filter { if net ~ [ 2001:db8::/32{128,128} ] then accept; reject; }; export none; };
}
protocol bgp node1 from nodes { neighbor 10.0.0.11 as 64513; }
protocol bgp node2 from nodes { neighbor 10.0.0.12 as 64513; }
`), 0o644)
	lab.runBird("router", conf, filepath.Join(lab.dir, "bird.ctl"), "bird")
}

var viaRE = regexp.MustCompile(`via (?:inet6 )?([0-9a-f.:]+)`)

// nextHopsFor are the router's kernel next hops for the host route to ip
// (/32 or /128), sorted.
func (lab *bgpLab) nextHopsFor(ip string) []string {
	family := "-4" // `ip route` lists IPv4 only unless told otherwise
	if strings.Contains(ip, ":") {
		family = "-6"
	}
	out, err := exec.Command("ip", family, "-n", lab.name("router"), "route", "show", "table", "main", "exact", ip).Output()
	if err != nil {
		return nil
	}
	var hops []string
	for _, m := range viaRE.FindAllStringSubmatch(string(out), -1) {
		hops = append(hops, m[1])
	}
	slices.Sort(hops)
	return hops
}

func (lab *bgpLab) waitHops(t *testing.T, what string, want ...string) time.Duration {
	t.Helper()
	return lab.waitHopsFor(t, vip, what, want...)
}

func (lab *bgpLab) waitHopsFor(t *testing.T, ip, what string, want ...string) time.Duration {
	t.Helper()
	d, ok := waitFor(context.Background(), 30*time.Second, func() bool { return slices.Equal(lab.nextHopsFor(ip), want) })
	if !ok {
		t.Fatalf("%s: router next hops for %s %v, want %v\nbirdc show route all:\n%s\nbirdc show protocols all:\n%s",
			what, ip, lab.nextHopsFor(ip), want, lab.birdc("show", "route", "all"), lab.birdc("show", "protocols", "all"))
	}
	return d
}

// birdc runs a BIRD CLI command in the router and returns its output.
func (lab *bgpLab) birdc(args ...string) string {
	argv := append([]string{"birdc", "-s", filepath.Join(lab.dir, "bird.ctl")}, args...)
	out, err := lab.command("router", argv...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s: %v", out, err)
	}
	return string(out)
}

func speakerConfig() bgp.Config {
	return bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}}
}

// TestBGPECMPWithdrawStop: both nodes announce -> ECMP over exactly both;
// a client reaches a pod through the router; one node withdrawing (what
// the hook does when its last local endpoint goes, Local policy) leaves
// exactly the other; a speaker stopping withdraws its route.
func TestBGPECMPWithdrawStop(t *testing.T) {
	lab := newBGPLab(t)
	n1 := lab.startSpeaker("node1", "10.0.0.11", speakerConfig())
	n2 := lab.startSpeaker("node2", "10.0.0.12", speakerConfig())
	n1.set(vip)
	n2.set(vip)
	d := lab.waitHops(t, "both announce", "10.0.0.11", "10.0.0.12")
	t.Logf("ECMP route with both next hops %v after announce (includes session setup)", d.Round(time.Millisecond))

	seen := map[string]bool{}
	for i := 0; i < 40 && len(seen) < 2; i++ {
		got, err := lab.get("client", vip+":80")
		if err != nil {
			t.Fatalf("client -> %s: %v", vip, err)
		}
		seen[got] = true
	}
	if !seen["pod1"] && !seen["pod2"] {
		t.Fatalf("client reached %v, want a pod", seen)
	}
	t.Logf("client reached %v through the router", seen)

	t0 := time.Now()
	n2.set() // node2 can no longer serve
	lab.waitHops(t, "node2 withdraws", "10.0.0.11")
	t.Logf("withdrawal visible in the router's FIB %v after Set", time.Since(t0).Round(time.Millisecond))
	for i := 0; i < 10; i++ {
		if got, err := lab.get("client", vip+":80"); err != nil || got != "pod1" {
			t.Fatalf("after withdrawal: got %q, %v; want pod1", got, err)
		}
	}

	n2.set(vip)
	lab.waitHops(t, "node2 re-announces", "10.0.0.11", "10.0.0.12")
	t0 = time.Now()
	n1.stop()
	lab.waitHops(t, "node1 stops", "10.0.0.12")
	t.Logf("stopped speaker's route gone %v after Stop returned", time.Since(t0).Round(time.Millisecond))
	n2.stop()
	lab.waitHops(t, "node2 stops")
}

// TestBGPBFDSilentNode: with BFD, a node that goes silent (all its packets
// dropped, no TCP FIN, no NOTIFICATION) is removed by BFD, not by the hold
// timer; BIRD says so in the session's last error.
func TestBGPBFDSilentNode(t *testing.T) {
	lab := newBGPLabBFD(t, true)
	cfg := speakerConfig()
	cfg.Peers[0].BFD = true
	n1 := lab.startSpeaker("node1", "10.0.0.11", cfg)
	n2 := lab.startSpeaker("node2", "10.0.0.12", cfg)
	n1.set(vip)
	n2.set(vip)
	lab.waitHops(t, "both announce", "10.0.0.11", "10.0.0.12")
	time.Sleep(2 * time.Second) // let the BFD sessions come up
	rules := filepath.Join(lab.dir, "blackhole.nft")
	os.WriteFile(rules, []byte("table inet ohxbh {\n chain i { type filter hook input priority 0; policy drop; }\n chain o { type filter hook output priority 0; policy drop; }\n}\n"), 0o644)
	t0 := time.Now()
	lab.exec("node2", "nft", "-f", rules)
	lab.waitHops(t, "node2 silent", "10.0.0.11")
	t.Logf("silent node2 removed from the router's FIB after %v (hold time 9 s)", time.Since(t0).Round(time.Millisecond))
	out, err := lab.command("router", "birdc", "-s", filepath.Join(lab.dir, "bird.ctl"), "show", "protocols", "all", "node2").CombinedOutput()
	if err != nil {
		t.Fatalf("birdc: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "BFD session down") {
		t.Fatalf("node2 was not removed by BFD:\n%s", out)
	}
}

// TestBGPIPv6ECMP: the speakers announce an IPv6 VIP (/128) with each
// node's IPv6 address as next hop, over MP-BGP on the IPv4 sessions; BIRD's
// kernel table in the router holds the /128 with exactly the serving nodes
// as ECMP next hops, a client reaches a pod over IPv6 through it, and a
// withdrawal leaves exactly the other node. The IPv4 VIP keeps working
// beside it on the same sessions.
func TestBGPIPv6ECMP(t *testing.T) {
	lab := newBGPLab(t)
	n1 := lab.startSpeaker("node1", "10.0.0.11,fd00::11", speakerConfig())
	n2 := lab.startSpeaker("node2", "10.0.0.12,fd00::12", speakerConfig())
	n1.set(vip, vip6)
	n2.set(vip, vip6)
	d := lab.waitHopsFor(t, vip6, "both announce", "fd00::11", "fd00::12")
	t.Logf("IPv6 ECMP route with both next hops %v after announce (includes session setup)", d.Round(time.Millisecond))
	lab.waitHops(t, "IPv4 beside IPv6", "10.0.0.11", "10.0.0.12")
	t.Logf("router's kernel route:\n%s", lab.ip("router", "-6", "route", "show", "exact", vip6))

	addr := "[" + vip6 + "]:80"
	seen := map[string]bool{}
	for i := 0; i < 40 && len(seen) < 2; i++ {
		got, err := lab.get("client", addr)
		if err != nil {
			t.Fatalf("client -> %s: %v", addr, err)
		}
		if got != "pod1" && got != "pod2" {
			t.Fatalf("client -> %s: %q, want a pod", addr, got)
		}
		seen[got] = true
	}
	t.Logf("client reached %v over IPv6 through the router", seen)

	t0 := time.Now()
	n2.set(vip) // node2 can no longer serve the IPv6 VIP
	lab.waitHopsFor(t, vip6, "node2 withdraws the IPv6 VIP", "fd00::11")
	t.Logf("IPv6 withdrawal visible in the router's FIB %v after Set", time.Since(t0).Round(time.Millisecond))
	lab.waitHops(t, "IPv4 untouched", "10.0.0.11", "10.0.0.12")
	for i := 0; i < 10; i++ {
		if got, err := lab.get("client", addr); err != nil || got != "pod1" {
			t.Fatalf("after withdrawal: got %q, %v; want pod1", got, err)
		}
	}
	n1.stop()
	lab.waitHopsFor(t, vip6, "node1 stops")
	n2.stop()
}
