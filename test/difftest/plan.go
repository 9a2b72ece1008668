package difftest

import (
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
)

// The addressing plan is test/netns's (its exported ranges), and it is the
// same in both twins: their namespaces are separate, so the same addresses
// can be used twice. Only documentation and private ranges, only inside
// namespaces this package created.

const (
	nodes       = 2 // node-1, node-2
	podsPerNode = 2 // pod-N-1, pod-N-2 on node N
)

// Where the NodePort, external and load-balancer probes are sent from
// outside and which the agent may serve externalIPs in: each external
// range's lower half. The upper halves are routed to node 1 all the same,
// so an externalIP there shows the deliberate difference (allowed.go).
const (
	allowedExternalCIDR  = "203.0.113.0/25"
	allowedExternalCIDR6 = "2001:db8:113::/65"
)

// externalIP6 is address n of the external IPv6 range's lower half
// (allowed) or upper half.
func externalIP6(n int, allowed bool) netip.Addr {
	a := netip.MustParsePrefix(netns.ExternalCIDR6).Addr().As16()
	if !allowed {
		a[8] = 0x80
	}
	a[14], a[15] = byte(n>>8), byte(n)
	return netip.AddrFrom16(a)
}

func routerIP() netip.Addr { return netip.MustParseAddr("192.0.2.1") }

func routerIP6() netip.Addr { return netip.MustParseAddr("2001:db8:2::1") }

func routerClientSideIP() netip.Addr { return netip.MustParseAddr("198.51.100.1") }

func routerClientSideIP6() netip.Addr { return netip.MustParseAddr("2001:db8:51::1") }

func controlPlaneIP6() netip.Addr { return netip.MustParseAddr("2001:db8:2::2") }

func clientIP6() netip.Addr { return netip.MustParseAddr("2001:db8:51::10") }

// nodeName, nodeIP and friends give node n's (1-based) identity and addresses.
func nodeName(n int) string { return fmt.Sprintf("node-%d", n) }

func nodeIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + n)}) }

func nodeIP6(n int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:2::%x", 0x10+n))
}

func nodeZone(n int) string { return fmt.Sprintf("zone-%c", 'a'+n-1) }

func podCIDR(n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(n), 0}), 24)
}

func podCIDR6(n int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:244:%x::/64", n))
}

// bridgeIP is node n's address on its pods' bridge, their gateway.
func bridgeIP(n int) netip.Addr { return podCIDR(n).Addr().Next() }

func bridgeIP6(n int) netip.Addr { return podCIDR6(n).Addr().Next() }

// podName and podIP give pod j (1-based) of node n.
func podName(n, j int) string { return fmt.Sprintf("pod-%d-%d", n, j) }

func podIP(n, j int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(n), byte(10 + j)}) }

func podIP6(n, j int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:244:%x::%x", n, 0x10+j))
}

// podRef names one pod of the plan.
type podRef struct{ Node, Index int }

func (p podRef) Name() string { return podName(p.Node, p.Index) }

func (p podRef) IP() netip.Addr { return podIP(p.Node, p.Index) }

func (p podRef) IP6() netip.Addr { return podIP6(p.Node, p.Index) }

// IPOf returns the pod's address of family f.
func (p podRef) IPOf(f v1.IPFamily) netip.Addr {
	if f == v1.IPv6Protocol {
		return p.IP6()
	}
	return p.IP()
}

// allPods lists every pod of the plan, node by node.
func allPods() []podRef {
	var out []podRef
	for n := 1; n <= nodes; n++ {
		for j := 1; j <= podsPerNode; j++ {
			out = append(out, podRef{n, j})
		}
	}
	return out
}

// The echo server's ports (every pod serves them, as in test/netns): TCP
// 8080, 8081 and 5353; UDP 8080 and 5353. closedPort is served by none.
var (
	echoTCP = netns.EchoTCPPorts()
	echoUDP = netns.EchoUDPPorts()
)

const closedPort = 9

// The twins' service CIDRs, one per family: their API servers allocate
// from them and both proxies take them as theirs.
var (
	serviceCIDR  = netip.MustParsePrefix("10.96.0.0/16")
	serviceCIDR6 = netip.MustParsePrefix("fd00:96::/112")
	serviceCIDRs = serviceCIDR.String() + "," + serviceCIDR6.String()
)

// Cluster IPs, per family: the case's Services take theirs from the upper
// half of the service CIDR (serviceBand), the barrier's from the first
// addresses of the lower half; the unallocated IPs are never given to a
// Service.
var (
	serviceBand    = netip.MustParsePrefix("10.96.128.0/17")
	serviceBand6   = netip.MustParsePrefix("fd00:96::8000/113")
	unallocatedIP  = netip.MustParseAddr("10.96.0.250")
	unallocatedIP6 = netip.MustParseAddr("fd00:96::fa")
)

// barrierIPs are the barrier Service's cluster IPs in round, one per
// family: host 10 to 209 of each service CIDR.
func barrierIPs(round int) []netip.Addr {
	n := byte(10 + round%200)
	a, a6 := serviceCIDR.Addr().As4(), serviceCIDR6.Addr().As16()
	a[3], a6[15] = n, n
	return []netip.Addr{netip.AddrFrom4(a), netip.AddrFrom16(a6)}
}

// family is the IP family of a.
func family(a netip.Addr) v1.IPFamily {
	if a.Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

func with24(a netip.Addr) string { return a.String() + "/24" }

func with64(a netip.Addr) string { return a.String() + "/64" }
