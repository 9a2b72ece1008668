package l2

import (
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/test/nsutil"
)

// TestResponderHearsAddressAddedAtStart: the interface has no IPv4
// address when the responder opens its sockets (it answers NDP only), and
// gains one right after. The responder hears of it and answers ARP too,
// before its periodic recheck of the interfaces would have come round.
func TestResponderHearsAddressAddedAtStart(t *testing.T) {
	node, peer := nsutil.New(t, "l2n-"), nsutil.New(t, "l2p-")
	node.Sysctl(t, "net.ipv6.conf.default.accept_dad", "0") // eth0's link-local address is usable at once
	nsutil.Veth(t, node, "eth0", nil, peer, "eth0", []string{"10.77.0.2/24"})
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(node.IP(t, "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link"), "fe80::"); {
		if time.Now().After(deadline) {
			t.Fatal("eth0 got no IPv6 link-local address")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := node.IP(t, "-4", "-o", "addr", "show", "dev", "eth0"); out != "" {
		t.Fatalf("eth0 has an IPv4 address before the responder starts: %s", out)
	}
	start := time.Now()
	startResponder(t, node, vip4, "OHL2_ADDR_AFTER_OPEN=10.77.0.1/24")

	want := macOf(t, node, "eth0")
	var got string
	var err error
	for time.Since(start) < recheckEvery/2 {
		if got, err = askARP(peer, vip4); got == want {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("ARP for %s unanswered %v after the start (%q, %v), want %s: the new address waits for the recheck every %v", vip4, time.Since(start).Round(time.Millisecond), got, err, want, recheckEvery)
}

// addAddr adds addr (a prefix) to the interface iface.
func addAddr(iface, addr string) error {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		return err
	}
	return netlink.AddrAdd(l, a)
}
