package nft

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// TraceMethod is how Trace finds its answer.
const TraceMethod = "evaluated from the kernel's ruleset (table inet onehop, read back now)"

// traceSourcePort is the client's port when the query gives none: only
// the pick of a Maglev chain reads the source port, and the trace says so
// when it meets one.
const traceSourcePort = 40000

// Trace implements dataplane.Tracer: it reads the table back from the
// kernel and evaluates its rules for the first packet of the connection
// (see trace_eval.go), then looks for conntrack entries that would take the
// connection's packets elsewhere.
func (b *Backend) Trace(ctx context.Context, q dataplane.TraceQuery) (*dataplane.Trace, error) {
	proto, ok := portal.ParseProtocol(q.Protocol)
	if !ok {
		return nil, fmt.Errorf("protocol %q: must be tcp, udp or sctp", q.Protocol)
	}
	if !q.To.IsValid() {
		return nil, fmt.Errorf("no destination")
	}
	h, err := nsHandle(b.netnsFD)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	local, err := localAddrs(h)
	if err != nil {
		return nil, err
	}
	dst := q.To.Addr().Unmap()
	src := q.From.Unmap()
	if q.FromNode {
		if src, err = nodeSource(h, dst); err != nil {
			return nil, err
		}
	}
	if !src.IsValid() {
		return nil, fmt.Errorf("no source address")
	}
	if src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("source %s and destination %s are not of one family", src, dst)
	}
	k, err := readKernel(b.netnsFD, b.table)
	if err != nil {
		return nil, err
	}
	sport := q.SourcePort
	if sport == 0 {
		sport = traceSourcePort
	}
	env := &evalEnv{k: k, local: local}
	pkt := newTracePacket(src, dst, sport, q.To.Port(), byte(proto))
	runs, err := env.paths(pkt, q.FromNode)
	if err != nil {
		return nil, fmt.Errorf("evaluating the ruleset: %w", err)
	}
	t := report(runs)
	t.Method = TraceMethod
	t.From = src.String()
	if q.SourcePort != 0 {
		t.From = netip.AddrPortFrom(src, q.SourcePort).String()
	}
	if q.FromNode {
		t.From = "node (" + t.From + ")"
	}
	t.To, t.Protocol = netip.AddrPortFrom(dst, q.To.Port()).String(), proto.String()
	if t.Match == nil {
		if t.Match = env.entryOf(pkt); t.Match != nil {
			t.Notes = append(t.Notes, "the destination is a way into "+t.Match.Service+", but the packet is stopped before it is dispatched")
		}
	}
	if t.Conntrack, err = conntrackOf(h, src, q.SourcePort, netip.AddrPortFrom(dst, q.To.Port()), byte(proto), t.Endpoints()); err != nil {
		t.Notes = append(t.Notes, "conntrack not read: "+err.Error())
	}
	t.Notes = append(t.Notes, "only onehop's table is evaluated: other tables and iptables rules of the node may still drop or change the packet")
	return t, nil
}

func nsHandle(netnsFD int) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if netnsFD >= 0 {
		h, err = netlink.NewHandleAt(netns.NsHandle(netnsFD), unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return h, nil
}

// localAddrs returns what `fib ... type local` finds local: the addresses
// of the node's interfaces, and the whole prefix of those on loopback.
func localAddrs(h *netlink.Handle) (func(netip.Addr) bool, error) {
	list, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var addrs []netip.Addr
	var nets []netip.Prefix
	for _, a := range list {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		addrs = append(addrs, ip)
		if ones, _ := a.Mask.Size(); ip.IsLoopback() {
			nets = append(nets, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	return func(a netip.Addr) bool {
		for _, l := range addrs {
			if l == a {
				return true
			}
		}
		for _, p := range nets {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}, nil
}

// nodeSource is the address the node sends from to dst, as routing picks it.
func nodeSource(h *netlink.Handle, dst netip.Addr) (netip.Addr, error) {
	routes, err := h.RouteGet(net.IP(dst.AsSlice()))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route from the node to %s: %w", dst, err)
	}
	for _, r := range routes {
		if a, ok := netip.AddrFromSlice(r.Src); ok {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("routing names no source address of the node towards %s", dst)
}
