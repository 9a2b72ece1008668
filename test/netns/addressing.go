package netns

import (
	"fmt"
	"net/netip"
)

// The addressing plan. Only documentation and private ranges, only inside
// namespaces this package created.
const (
	// ClusterCIDR holds every node's pod CIDR (10.244.N.0/24 for node N).
	ClusterCIDR = "10.244.0.0/16"
	// NodeCIDR is the node segment: router .1, control plane .2, node N .10+N.
	NodeCIDR = "192.0.2.0/24"
	// ClientCIDR is the external client's segment: router .1, client .10.
	ClientCIDR = "198.51.100.0/24"
	// ExternalCIDR is the range for spec.externalIPs and load-balancer
	// ingress IPs; the router sends it to a node (node 1 by default).
	ExternalCIDR = "203.0.113.0/24"
	// APIServerPort is kube-apiserver's port on ControlPlaneIP.
	APIServerPort = 6443
	// HealthzPort and MetricsPort are the agent's, on every node.
	HealthzPort = 10256
	MetricsPort = 10249
)

// Echo server ports every pod listens on.
const (
	PortHTTP = 8080 // TCP and UDP
	PortAlt  = 8081 // TCP
	PortDNS  = 5353 // TCP and UDP
)

// EchoTCPPorts and EchoUDPPorts list what each pod's echo server serves.
func EchoTCPPorts() []int { return []int{PortHTTP, PortAlt, PortDNS} }

// EchoUDPPorts lists the UDP ports each pod's echo server serves.
func EchoUDPPorts() []int { return []int{PortHTTP, PortDNS} }

func routerNodeIP() netip.Addr { return netip.MustParseAddr("192.0.2.1") }

// ControlPlaneIP is kube-apiserver's address on the node segment.
func ControlPlaneIP() netip.Addr { return netip.MustParseAddr("192.0.2.2") }

func nodeIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + n)}) }

func routerClientIP() netip.Addr { return netip.MustParseAddr("198.51.100.1") }

// ClientIP is the external client's address.
func ClientIP() netip.Addr { return netip.MustParseAddr("198.51.100.10") }

func podCIDR(n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(n), 0}), 24)
}

func podGateway(n int) netip.Addr { return podCIDR(n).Addr().Next() }

func podIP(n, i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(n), byte(10 + i)}) }

func with24(a netip.Addr) string { return fmt.Sprintf("%s/24", a) }

// ExternalIP returns the i-th address of ExternalCIDR (i in 1..254).
func ExternalIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}) }

// The IPv6 half of the plan: the same layout in documentation (2001:db8::/32)
// and unique-local ranges. Every link is dual-stack.
const (
	// ClusterCIDR6 holds every node's IPv6 pod CIDR (fd00:244:N::/64).
	ClusterCIDR6 = "fd00:244::/48"
	// NodeCIDR6 is the node segment: router ::1, control plane ::2, node N ::10+N.
	NodeCIDR6 = "2001:db8:2::/64"
	// ClientCIDR6 is the client's segment: router ::1, client ::10.
	ClientCIDR6 = "2001:db8:51::/64"
	// ExternalCIDR6 is the IPv6 range for external and load-balancer IPs.
	ExternalCIDR6 = "2001:db8:113::/64"
)

func v6(prefix string, host uint16) netip.Addr {
	a := netip.MustParsePrefix(prefix).Addr().As16()
	a[14], a[15] = byte(host>>8), byte(host)
	return netip.AddrFrom16(a)
}

func routerNodeIP6() netip.Addr { return v6(NodeCIDR6, 1) }

// ControlPlaneIP6 is the control plane's IPv6 address on the node segment.
func ControlPlaneIP6() netip.Addr { return v6(NodeCIDR6, 2) }

func nodeIP6(n int) netip.Addr { return v6(NodeCIDR6, uint16(0x10+n)) }

func routerClientIP6() netip.Addr { return v6(ClientCIDR6, 1) }

// ClientIP6 is the external client's IPv6 address.
func ClientIP6() netip.Addr { return v6(ClientCIDR6, 0x10) }

func podCIDR6(n int) netip.Prefix {
	a := netip.MustParsePrefix(ClusterCIDR6).Addr().As16()
	a[6], a[7] = byte(n>>8), byte(n)
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

func podGateway6(n int) netip.Addr { return podCIDR6(n).Addr().Next() }

func podIP6(n, i int) netip.Addr {
	a := podCIDR6(n).Addr().As16()
	a[15] = byte(0x10 + i)
	return netip.AddrFrom16(a)
}

func with64(a netip.Addr) string { return a.String() + "/64" }

// ExternalIP6 returns the i-th address of ExternalCIDR6.
func ExternalIP6(i int) netip.Addr { return v6(ExternalCIDR6, uint16(i)) }
