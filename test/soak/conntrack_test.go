package soak

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func flow(proto uint8, src, dst string, dport uint16, replySrc string, replySport uint16) *netlink.ConntrackFlow {
	return &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(src), DstIP: net.ParseIP(dst), SrcPort: 40000, DstPort: dport},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(replySrc), DstIP: net.ParseIP(src), SrcPort: replySport, DstPort: 40000},
	}
}

// A DNATed UDP flow is stale when its Service address is gone or its
// target no longer backs it; TCP flows, and flows not DNATed, are not
// looked at.
func TestStaleUDP(t *testing.T) {
	ap := netip.MustParseAddrPort
	served := map[netip.AddrPort]map[netip.AddrPort]bool{
		ap("10.96.0.10:53"):    {ap("10.244.1.11:5353"): true},
		ap("192.0.2.11:30053"): {ap("10.244.1.11:5353"): true},
	}
	flows := []*netlink.ConntrackFlow{
		flow(unix.IPPROTO_UDP, "10.244.1.10", "10.96.0.10", 53, "10.244.1.11", 5353),    // right
		flow(unix.IPPROTO_UDP, "10.244.1.10", "192.0.2.11", 30053, "10.244.1.11", 5353), // right, by node port
		flow(unix.IPPROTO_UDP, "10.244.1.10", "10.96.0.10", 53, "10.244.2.12", 5353),    // to a former endpoint
		flow(unix.IPPROTO_UDP, "10.244.1.10", "10.96.0.99", 53, "10.244.2.12", 5353),    // through a deleted Service
		flow(unix.IPPROTO_UDP, "10.244.1.10", "10.244.2.12", 5353, "10.244.2.12", 5353), // not DNATed
		flow(unix.IPPROTO_TCP, "10.244.1.10", "10.96.0.99", 80, "10.244.2.12", 8080),    // TCP
	}
	stale, checked := staleUDP(flows, served)
	if checked != 4 || len(stale) != 2 {
		t.Fatalf("checked %d, stale %v; want 4 checked, 2 stale", checked, stale)
	}
	if !strings.Contains(stale[0], "10.244.2.12:5353, not an endpoint") || !strings.Contains(stale[1], "no Service has 10.96.0.99:53") {
		t.Errorf("stale: %v", stale)
	}
}
