package ipam

import (
	"fmt"
	"math/big"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/portal"
)

// Range is an inclusive range of addresses of one family.
type Range struct {
	First, Last netip.Addr
}

// Contains reports whether a is inside r.
func (r Range) Contains(a netip.Addr) bool {
	a = a.Unmap()
	return a.BitLen() == r.First.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Size is the number of addresses in r.
func (r Range) Size() *big.Int {
	f, l := new(big.Int).SetBytes(r.First.AsSlice()), new(big.Int).SetBytes(r.Last.AsSlice())
	return l.Sub(l, f).Add(l, big.NewInt(1))
}

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// ParseRange parses "10.0.0.0/24", "10.0.0.10-10.0.0.20", or a single
// address, of either family.
func ParseRange(s string) (Range, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Range{}, fmt.Errorf("bad CIDR %q: %v", s, err)
		}
		p = p.Masked()
		return Range{First: p.Addr(), Last: lastOf(p)}, nil
	}
	if a, b, ok := strings.Cut(s, "-"); ok {
		f, err := netip.ParseAddr(strings.TrimSpace(a))
		if err != nil {
			return Range{}, fmt.Errorf("bad range %q: %v", s, err)
		}
		l, err := netip.ParseAddr(strings.TrimSpace(b))
		if err != nil {
			return Range{}, fmt.Errorf("bad range %q: %v", s, err)
		}
		f, l = f.Unmap(), l.Unmap()
		if f.BitLen() != l.BitLen() {
			return Range{}, fmt.Errorf("bad range %q: mixes IPv4 and IPv6", s)
		}
		if l.Less(f) {
			return Range{}, fmt.Errorf("bad range %q: last address before first", s)
		}
		return Range{First: f, Last: l}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return Range{}, fmt.Errorf("bad address %q: want CIDR, first-last or address", s)
	}
	a = a.Unmap()
	return Range{First: a, Last: a}, nil
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Pool is a named set of address ranges.
type Pool struct {
	Name   string
	Ranges []Range
	// AutoAssign lets Services that name no pool get addresses from it.
	AutoAssign bool
	// AllowPods lets Pods claim its addresses as pod external IPs.
	AllowPods bool
}

// NewPool parses the address specs of a pool (see ParseRange).
func NewPool(name string, specs []string, autoAssign, allowPods bool) (Pool, error) {
	if name == "" {
		return Pool{}, fmt.Errorf("pool without a name")
	}
	p := Pool{Name: name, AutoAssign: autoAssign, AllowPods: allowPods}
	if len(specs) == 0 {
		return Pool{}, fmt.Errorf("pool %q has no addresses", name)
	}
	for _, s := range specs {
		r, err := ParseRange(s)
		if err != nil {
			return Pool{}, fmt.Errorf("pool %q: %w", name, err)
		}
		p.Ranges = append(p.Ranges, r)
	}
	return p, nil
}

// Contains reports whether a is in one of p's ranges.
func (p *Pool) Contains(a netip.Addr) bool {
	for _, r := range p.Ranges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// HasFamily reports whether p has addresses of family f.
func (p *Pool) HasFamily(f portal.Family) bool {
	for _, r := range p.Ranges {
		if portal.FamilyOf(r.First) == f {
			return true
		}
	}
	return false
}
