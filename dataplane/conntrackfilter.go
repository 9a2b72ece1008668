package dataplane

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// ctVIP is a Service address and port: an original destination.
type ctVIP struct {
	proto uint8
	addr  netip.Addr
	port  uint16 // 0 for SCTP (ports are not decoded)
}

// ctNodePort is a NodePort in one family.
type ctNodePort struct {
	proto  uint8
	family portal.Family
	port   uint16
}

// ctTarget says which flows to a destination are still right.
type ctTarget struct {
	// endpoints are the current serving endpoints; a DNATed flow to
	// another is stale. For SCTP only the addresses count (port 0).
	endpoints map[netip.AddrPort]struct{}
	// balanced: the destination has DNAT targets, so a flow that was not
	// DNATed is stale.
	balanced bool
}

// conntrackFilter matches the stale entries of the changed Service ports.
// It implements netlink.CustomConntrackFilter.
type conntrackFilter struct {
	vips      map[ctVIP]*ctTarget
	nodePorts map[ctNodePort]*ctTarget
	// nodeAddrs are the addresses NodePorts are served on; empty means any.
	nodeAddrs map[netip.Addr]struct{}
	ports     int // changed service ports, for the log
	v4, v6    bool
}

func (f *conntrackFilter) empty() bool { return len(f.vips) == 0 && len(f.nodePorts) == 0 }

func (f *conntrackFilter) families() []netlink.InetFamily {
	var out []netlink.InetFamily
	if f.v4 {
		out = append(out, unix.AF_INET)
	}
	if f.v6 {
		out = append(out, unix.AF_INET6)
	}
	return out
}

func toAddr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// MatchConntrackFlow reports whether flow is stale.
func (f *conntrackFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	proto := flow.Forward.Protocol
	switch proto {
	case uint8(portal.UDP), uint8(portal.SCTP):
	case uint8(portal.TCP):
		if !halfOpen(flow) {
			return false
		}
	default:
		return false
	}
	dst := toAddr(flow.Forward.DstIP)
	dport := flow.Forward.DstPort
	replySrc := netip.AddrPortFrom(toAddr(flow.Reverse.SrcIP), flow.Reverse.SrcPort)
	if proto == uint8(portal.SCTP) {
		dport, replySrc = 0, netip.AddrPortFrom(replySrc.Addr(), 0)
	}
	natted := replySrc != netip.AddrPortFrom(dst, dport)
	if t, ok := f.vips[ctVIP{proto, dst, dport}]; ok {
		return t.stale(natted, replySrc)
	}
	if proto == uint8(portal.SCTP) {
		return false
	}
	if t, ok := f.nodePorts[ctNodePort{proto, portal.FamilyOf(dst), dport}]; ok {
		if len(f.nodeAddrs) > 0 {
			if _, local := f.nodeAddrs[dst]; !local {
				return false
			}
		}
		return t.stale(natted, replySrc)
	}
	return false
}

// TCP conntrack states of a connection whose SYN got no SYN-ACK
// (TCP_CONNTRACK_SYN_SENT, and SYN_SENT2 of a simultaneous open).
const (
	tcpSynSent  = 1
	tcpSynSent2 = 9
)

// halfOpen reports whether a TCP flow never got an answer.
func halfOpen(flow *netlink.ConntrackFlow) bool {
	tcp, ok := flow.ProtoInfo.(*netlink.ProtoInfoTCP)
	return ok && (tcp.State == tcpSynSent || tcp.State == tcpSynSent2)
}

func (t *ctTarget) stale(natted bool, replySrc netip.AddrPort) bool {
	if !natted {
		return t.balanced
	}
	_, ok := t.endpoints[replySrc]
	return !ok
}
