package ipam

import (
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

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

// Aligned reports whether r is made of whole prefixes of length bits:
// it starts where one starts and ends where one ends, so that the
// prefix of that length around any of its addresses lies inside r.
func (r Range) Aligned(bits int) bool {
	if bits < 0 || bits > r.First.BitLen() {
		return false
	}
	return netip.PrefixFrom(r.First, bits).Masked().Addr() == r.First && lastOf(netip.PrefixFrom(r.Last, bits).Masked()) == r.Last
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Pool is a named set of address ranges, and who may use them.
type Pool struct {
	Name   string
	Ranges []Range
	PoolOptions
}

// PoolOptions say who may use a pool's addresses and how.
type PoolOptions struct {
	// AutoAssign lets Services that name no pool get addresses from it
	// (never when AllowPods is set: those addresses are for Pods).
	AutoAssign bool
	// AllowPods lets Pods claim its addresses as pod external IPs.
	AllowPods bool
	// Namespaces are the only namespaces whose Services may use the pool;
	// empty admits every namespace.
	Namespaces []string
	// Selectors admit the Services whose labels match any of them; empty
	// admits every Service.
	Selectors []labels.Selector
	// Priority orders auto-assignment: pools with lower values are tried
	// first; equal priorities keep the configuration order.
	Priority int
	// ShareAcrossNamespaces lets Services of different namespaces share an
	// address under one sharing key; otherwise a key joins only Services
	// of one namespace.
	ShareAcrossNamespaces bool
	// KeepNetworkAndBroadcast hands out the first and last address of
	// IPv4 CIDRs (and the Subnet-Router anycast address, the first one, of
	// IPv6 CIDRs), which are skipped by default.
	KeepNetworkAndBroadcast bool
}

// NewPool parses the address specs of a pool (see ParseRange). Unless
// o.KeepNetworkAndBroadcast, an IPv4 CIDR of /30 or larger loses its
// network and broadcast addresses, and an IPv6 CIDR of /126 or larger its
// Subnet-Router anycast address: those are not the pool's.
func NewPool(name string, specs []string, o PoolOptions) (Pool, error) {
	if name == "" {
		return Pool{}, fmt.Errorf("pool without a name")
	}
	p := Pool{Name: name, PoolOptions: o}
	if len(specs) == 0 {
		return Pool{}, fmt.Errorf("pool %q has no addresses", name)
	}
	for _, s := range specs {
		r, err := ParseRange(s)
		if err != nil {
			return Pool{}, fmt.Errorf("pool %q: %w", name, err)
		}
		if !o.KeepNetworkAndBroadcast {
			r = trimCIDR(s, r)
		}
		p.Ranges = append(p.Ranges, r)
	}
	return p, nil
}

// trimCIDR drops the addresses of CIDR spec s that are not for hosts.
func trimCIDR(s string, r Range) Range {
	pre, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return r // a range or a single address: taken as written
	}
	switch {
	case pre.Addr().Is4() && pre.Bits() <= 30:
		return Range{First: r.First.Next(), Last: r.Last.Prev()}
	case pre.Addr().Is6() && pre.Bits() <= 126:
		return Range{First: r.First.Next(), Last: r.Last}
	}
	return r
}

// Admits reports whether a Service in namespace with labels lbls may use p.
func (p *Pool) Admits(namespace string, lbls map[string]string) bool {
	if len(p.Namespaces) > 0 && !slices.Contains(p.Namespaces, namespace) {
		return false
	}
	if len(p.Selectors) == 0 {
		return true
	}
	for _, s := range p.Selectors {
		if s.Matches(labels.Set(lbls)) {
			return true
		}
	}
	return false
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
