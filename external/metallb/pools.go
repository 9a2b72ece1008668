package metallb

import (
	"errors"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

func (cv *converter) pool(o mlbObject) *ConvertedObject {
	var p mlbPool
	if !cv.decode(o, &p) {
		return nil
	}
	// MetalLB hands out every address of a CIDR, network and broadcast
	// addresses included; with avoidBuggyIPs, none ending in .0 or .255.
	spec := v1alpha1.LoadBalancerIPPoolSpec{AutoAssign: p.AutoAssign, AvoidNetworkAndBroadcast: new(false)}
	for _, a := range p.Addresses {
		norm, first, last, err := metalLBAddress(a)
		if err != nil {
			cv.warn(o, "address %q: %v, left out", a, err)
			continue
		}
		if p.AvoidBuggyIPs && first.Is4() {
			f, l := first, last
			if f.As4()[3] == 0 {
				f = f.Next()
			}
			if l.As4()[3] == 255 {
				l = l.Prev()
			}
			if l.Less(f) {
				cv.warn(o, "address %q holds only addresses avoidBuggyIPs avoids, left out", a)
				continue
			}
			if f != first || l != last {
				norm = f.String() + "-" + l.String()
			}
			if f4, l4 := f.As4(), l.As4(); [3]byte(f4[:3]) != [3]byte(l4[:3]) {
				cv.warn(o, "avoidBuggyIPs: onehop hands out the addresses ending in .0 or .255 inside %s", a)
			}
		}
		spec.Addresses = append(spec.Addresses, norm)
	}
	if len(spec.Addresses) == 0 {
		cv.warn(o, "no address onehop can use, pool left out")
		return nil
	}
	if sa := p.ServiceAllocation; sa != nil {
		spec.Priority = sa.Priority
		spec.Namespaces = sa.Namespaces
		spec.ServiceSelectors = sa.ServiceSelectors
		if len(sa.NamespaceSelectors) > 0 {
			cv.warn(o, "serviceAllocation.namespaceSelectors: onehop pools name their namespaces (namespaces), they do not select them by label")
		}
	}
	return onehopObject(config.KindPool, o, spec)
}

// metalLBAddress reads one of MetalLB's pool addresses: a CIDR, a range
// "first-last" (with or without spaces) or an address; norm is it as
// onehop writes it.
func metalLBAddress(a string) (norm string, first, last netip.Addr, err error) {
	a = strings.TrimSpace(a)
	if f, l, ok := strings.Cut(a, "-"); ok {
		if first, err = netip.ParseAddr(strings.TrimSpace(f)); err != nil {
			return "", first, last, err
		}
		if last, err = netip.ParseAddr(strings.TrimSpace(l)); err != nil {
			return "", first, last, err
		}
		switch {
		case first.Is4() != last.Is4():
			return "", first, last, errors.New("a range of two families")
		case last.Less(first):
			return "", first, last, errors.New("a range that ends before it starts")
		}
		return first.String() + "-" + last.String(), first, last, nil
	}
	if p, err := netip.ParsePrefix(a); err == nil {
		m := p.Masked()
		last := m.Addr()
		for b := m.Bits(); b < m.Addr().BitLen(); b++ {
			last = setBit(last, b)
		}
		return p.String(), m.Addr(), last, nil
	}
	if ip, err := netip.ParseAddr(a); err == nil {
		return ip.String(), ip, ip, nil
	}
	return "", first, last, errors.New("neither a CIDR nor a range")
}

// setBit sets bit i (0 the most significant) of a.
func setBit(a netip.Addr, i int) netip.Addr {
	b := a.AsSlice()
	b[i/8] |= 0x80 >> (i % 8)
	out, _ := netip.AddrFromSlice(b)
	return out
}
