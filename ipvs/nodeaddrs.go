package ipvs

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/portal"
)

// nodePortAddrs are the addresses NodePorts are served on: the node's
// configured ones, or else every global unicast address of the node.
func (b *Backend) nodePortAddrs(n portal.Node) ([]netip.Addr, error) {
	if len(n.NodePortAddrs) > 0 {
		out := slices.Clone(n.NodePortAddrs)
		for i, a := range out {
			out[i] = a.Unmap()
		}
		slices.SortFunc(out, netip.Addr.Compare)
		return slices.Compact(out), nil
	}
	own, err := b.ownAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range own {
		if a.IsGlobalUnicast() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// ownAddrs are the node's addresses on interfaces other than the dummy.
func (b *Backend) ownAddrs() ([]netip.Addr, error) {
	addrs, err := b.nl.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("ipvs: listing node addresses: %w", err)
	}
	dummyIdx := -1
	if l, err := b.nl.LinkByName(DummyInterface); err == nil {
		dummyIdx = l.Attrs().Index
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && a.LinkIndex != dummyIdx {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
