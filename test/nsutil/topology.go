package nsutil

import (
	"net/netip"
	"strconv"
	"testing"
)

// The addresses of a NodeTopology. Documentation ranges only (RFC 5737,
// RFC 3849) outside the cluster; pods get 10.244.N.2 and fd00:244:0:N::2.
const (
	NodeIP     = "198.51.100.1"
	ClientIP   = "198.51.100.2"
	Client2IP  = "198.51.100.130"
	Client2GW  = "198.51.100.129"
	NodeIP6    = "2001:db8:1::1"
	ClientIP6  = "2001:db8:1::2"
	UplinkIP   = "192.0.2.1"
	UpstreamIP = "192.0.2.2"
	UplinkIP6  = "2001:db8:2::1"
	Upstream6  = "2001:db8:2::2"
	// EchoPort is where every pod's echo server listens, TCP and UDP, on
	// all its addresses.
	EchoPort = 8080
)

// PodIP is pod i's IPv4 address (i from 0).
func PodIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 2}) }

// PodIP6 is pod i's IPv6 address.
func PodIP6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 0, byte(i + 1), 15: 2})
}

// podGW and podGW6 are the node's side of pod i's veth.
func podGW(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 1}) }

func podGW6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 0, byte(i + 1), 15: 1})
}

// PodName is the name pod i's echo server answers with: "pod0", "pod1", ...
func PodName(i int) string { return "pod" + strconv.Itoa(i) }

// NodeTopology is one node and what surrounds it, the bench every dataplane
// test programs: a node namespace (where the backend under test runs, with
// forwarding on), pods routed through it, two clients outside the cluster
// and an upstream dead end that is the node's default route, so traffic for
// an address without rules is forwarded there and never answered instead of
// being unroutable.
//
//	client   198.51.100.2   --- 198.51.100.1   (to-client)
//	client2  198.51.100.130 --- 198.51.100.129 (to-client2)   node
//	upstream 192.0.2.2      --- 192.0.2.1      (to-up, default route)
//	podN     10.244.N+1.2   --- 10.244.N+1.1   (pXXXXXX)
//
// The client, the upstream and the pods have IPv6 too (2001:db8:1::/64,
// 2001:db8:2::/64, fd00:244:0:N+1::/64); client2 is IPv4 only. Every pod runs
// an echo server (Echo) named PodName(i) on EchoPort. Everything is deleted
// when the test ends.
type NodeTopology struct {
	Node, Client, Client2, Upstream *NS
	Pods                            []*NS
}

// NewNodeTopology builds a NodeTopology with the given number of pods.
func NewNodeTopology(t testing.TB, pods int) *NodeTopology {
	t.Helper()
	tp := &NodeTopology{
		Node:     New(t, "ohn-"),
		Client:   New(t, "ohc-"),
		Client2:  New(t, "ohc-"),
		Upstream: New(t, "ohu-"),
	}
	tp.Node.Sysctl(t, "net.ipv4.ip_forward", "1")
	tp.Node.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	Veth(t, tp.Node, "to-client", []string{NodeIP + "/25", NodeIP6 + "/64"}, tp.Client, "eth0", []string{ClientIP + "/25", ClientIP6 + "/64"})
	tp.Client.IP(t, "route", "add", "default", "via", NodeIP)
	tp.Client.IP(t, "-6", "route", "add", "default", "via", NodeIP6)
	Veth(t, tp.Node, "to-client2", []string{Client2GW + "/25"}, tp.Client2, "eth0", []string{Client2IP + "/25"})
	tp.Client2.IP(t, "route", "add", "default", "via", Client2GW)
	Veth(t, tp.Node, "to-up", []string{UplinkIP + "/24", UplinkIP6 + "/64"}, tp.Upstream, "eth0", []string{UpstreamIP + "/24", Upstream6 + "/64"})
	tp.Node.IP(t, "route", "add", "default", "via", UpstreamIP)
	tp.Node.IP(t, "-6", "route", "add", "default", "via", Upstream6)
	for i := range pods {
		p := New(t, "ohp-")
		Veth(t, tp.Node, Unique("p"), []string{podGW(i).String() + "/24", podGW6(i).String() + "/64"},
			p, "eth0", []string{PodIP(i).String() + "/24", PodIP6(i).String() + "/64"})
		p.IP(t, "route", "add", "default", "via", podGW(i).String())
		p.IP(t, "-6", "route", "add", "default", "via", podGW6(i).String())
		p.Echo(t, PodName(i), ":"+strconv.Itoa(EchoPort))
		tp.Pods = append(tp.Pods, p)
	}
	return tp
}
