package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
)

// DummyInterface holds every Service VIP so that the kernel treats them as
// local and hands their packets to IPVS.
const DummyInterface = "onehop-ipvs0"

func (b *Backend) ensureDummy() (netlink.Link, error) {
	l, err := b.nl.LinkByName(DummyInterface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, fmt.Errorf("ipvs: %s: %w", DummyInterface, err)
		}
		la := netlink.NewLinkAttrs()
		la.Name = DummyInterface
		if err := b.nl.LinkAdd(&netlink.Dummy{LinkAttrs: la}); err != nil {
			return nil, fmt.Errorf("ipvs: creating %s (needs the dummy module): %w", DummyInterface, err)
		}
		if l, err = b.nl.LinkByName(DummyInterface); err != nil {
			return nil, err
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := b.nl.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("ipvs: %s up: %w", DummyInterface, err)
		}
	}
	return l, nil
}

func (b *Backend) dummyAddrs() ([]netip.Addr, error) {
	l, err := b.nl.LinkByName(DummyInterface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, err
	}
	as, err := b.nl.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("ipvs: addresses of %s: %w", DummyInterface, err)
	}
	var out []netip.Addr
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// dummyVIPs are the dummy's addresses, as a set.
func (b *Backend) dummyVIPs() (map[netip.Addr]bool, error) {
	addrs, err := b.dummyAddrs()
	if err != nil {
		return nil, err
	}
	vips := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		vips[a] = true
	}
	return vips, nil
}

// applyVIPs binds the wanted VIPs to the dummy interface and removes the others.
func (b *Backend) applyVIPs(have, want *plan) (int, error) {
	l, err := b.ensureDummy()
	if err != nil {
		return 0, err
	}
	msgs := 0
	for a := range want.VIPs {
		if have.VIPs[a] {
			continue
		}
		msgs++
		if err := b.nl.AddrAdd(l, vipAddr(a)); err != nil && !errors.Is(err, syscall.EEXIST) {
			return msgs, fmt.Errorf("ipvs: binding %s to %s: %w", a, DummyInterface, err)
		}
	}
	for a := range have.VIPs {
		if want.VIPs[a] {
			continue
		}
		msgs++
		if err := b.nl.AddrDel(l, vipAddr(a)); err != nil && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return msgs, fmt.Errorf("ipvs: unbinding %s: %w", a, err)
		}
	}
	return msgs, nil
}

func vipAddr(a netip.Addr) *netlink.Addr {
	pfx := netip.PrefixFrom(a, a.BitLen())
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(pfx.Bits(), a.BitLen())}}
	if a.Is6() {
		na.Flags = syscall.IFA_F_NODAD
	}
	return na
}
