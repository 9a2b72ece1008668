package external

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/external/l2"
)

const (
	vip6   = "2001:db8:1::10"
	l2VIPs = vip + "," + vip6
)

// l2Lab: node1, node2 and client on one bridge (in "sw"); each node DNATs
// the VIPs to its pod. Nothing configures the VIPs on an interface: only
// the responders make them reachable.
func newL2Lab(t *testing.T) *topo { return newL2LabOf(t, 2) }

// newL2LabOf is the l2Lab with nodes node1 ... nodeN (at 10.0.0.11 and
// fd00:1::11 on; their pods pod1 ... podN at 10.244.i.2 and
// fd00:244:i::2); the client is at 10.0.0.100.
func newL2LabOf(t *testing.T, nodes int) *topo {
	needs(t, "nft")
	lab := newTopo(t)
	dir := t.TempDir()
	var names []string
	for i := 1; i <= nodes; i++ {
		names = append(names, fmt.Sprintf("node%d", i))
		lab.add(fmt.Sprintf("node%d", i), fmt.Sprintf("pod%d", i))
	}
	lab.add("sw", "client")
	for _, n := range append(names, "client") {
		lab.exec(n, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0")
	}
	lab.ip("sw", "link", "add", "br0", "type", "bridge")
	lab.ip("sw", "link", "set", "br0", "up")
	for i, n := range append(names, "client") {
		lab.veth("sw", "v"+n, n, "eth0")
		lab.ip("sw", "link", "set", "v"+n, "master", "br0")
		host := 11 + i
		if n == "client" {
			host = 100
		}
		lab.ip(n, "addr", "add", fmt.Sprintf("10.0.0.%d/24", host), "dev", "eth0")
		lab.ip(n, "-6", "addr", "add", fmt.Sprintf("fd00:1::%d/64", host), "dev", "eth0", "nodad")
	}
	lab.ip("client", "route", "add", "203.0.113.0/24", "dev", "eth0")
	lab.ip("client", "-6", "route", "add", "2001:db8:1::/64", "dev", "eth0")
	for i := 1; i <= nodes; i++ {
		node, pod := fmt.Sprintf("node%d", i), fmt.Sprintf("pod%d", i)
		lab.exec(node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
		lab.veth(node, "pod", pod, "eth0")
		lab.ip(node, "addr", "add", fmt.Sprintf("10.244.%d.1/24", i), "dev", "pod")
		lab.ip(node, "-6", "addr", "add", fmt.Sprintf("fd00:244:%d::1/64", i), "dev", "pod", "nodad")
		lab.ip(pod, "addr", "add", fmt.Sprintf("10.244.%d.2/24", i), "dev", "eth0")
		lab.ip(pod, "-6", "addr", "add", fmt.Sprintf("fd00:244:%d::2/64", i), "dev", "eth0", "nodad")
		lab.ip(pod, "route", "add", "default", "via", fmt.Sprintf("10.244.%d.1", i))
		lab.ip(pod, "-6", "route", "add", "default", "via", fmt.Sprintf("fd00:244:%d::1", i))
		rules := filepath.Join(dir, node+".nft")
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
	return lab
}

func (tp *topo) mac(n, iface string) string {
	f := strings.Fields(tp.ip(n, "-br", "link", "show", iface))
	return f[2]
}

// neigh is the client's link-layer address for ip ("" when none).
func (tp *topo) neigh(ip string) string {
	out, _ := exec.Command("ip", "-n", tp.name("client"), "neigh", "show", ip).Output()
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "lladdr" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return ""
}

// TestL2AnswerAndTakeover: the owner (l2.Owner over both nodes) answers ARP
// and NDP for both VIPs, the client reaches the owner's pod; the owner's
// agent is killed, the other node takes over with a gratuitous
// announcement that moves the client's neighbour entries, and the client
// reaches the new owner's pod.
func TestL2AnswerAndTakeover(t *testing.T) {
	lab := newL2Lab(t)
	r := map[string]*speaker{"node1": lab.startResponder("node1", "eth0"), "node2": lab.startResponder("node2", "eth0")}

	owner := l2.Owner(netip4(vip), []string{"node1", "node2"})
	other := map[string]string{"node1": "node2", "node2": "node1"}[owner]
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	r[owner].set(l2VIPs)
	r[other].set()

	for _, addr := range []string{vip + ":80", "[" + vip6 + "]:80"} {
		got, err := lab.get("client", addr)
		if err != nil || got != pod[owner] {
			t.Fatalf("client -> %s: %q, %v; want %s (owner %s)", addr, got, err, pod[owner], owner)
		}
	}
	for _, ip := range []string{vip, vip6} {
		if got, want := lab.neigh(ip), lab.mac(owner, "eth0"); got != want {
			t.Fatalf("client's neighbour entry for %s: %q, want owner %s's %s", ip, got, owner, want)
		}
	}

	// The kernel ignores a new lladdr within locktime (1 s) of the last
	// update; a real takeover comes seconds after the last answer.
	time.Sleep(1100 * time.Millisecond)
	r[owner].kill()
	if got := l2.Owner(netip4(vip), []string{other}); got != other {
		t.Fatalf("owner among survivors: %s", got)
	}
	t0 := time.Now()
	r[other].set(l2VIPs)
	want := lab.mac(other, "eth0")
	for _, ip := range []string{vip, vip6} {
		d, ok := waitFor(context.Background(), 5*time.Second, func() bool { return lab.neigh(ip) == want })
		if !ok {
			t.Fatalf("gratuitous announcement did not move the client's entry for %s to %s: %q", ip, want, lab.neigh(ip))
		}
		t.Logf("client's neighbour entry for %s moved to %s %v after the new owner took over", ip, other, d.Round(time.Millisecond))
	}
	for _, addr := range []string{vip + ":80", "[" + vip6 + "]:80"} {
		got, err := lab.get("client", addr)
		if err != nil || got != pod[other] {
			t.Fatalf("after takeover client -> %s: %q, %v; want %s", addr, got, err, pod[other])
		}
	}
	t.Logf("takeover to %s served after %v (responder level; the hook adds lease expiry)", other, time.Since(t0).Round(time.Millisecond))
}
