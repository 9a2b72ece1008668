package bgp

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Route is one prefix a speaker announces, with its attributes.
type Route struct {
	Prefix netip.Prefix
	// Communities are RFC 1997 communities (ASN<<16 | value), sorted and
	// without repeats; LargeCommunities are RFC 8092's, likewise.
	Communities      []uint32
	LargeCommunities []LargeCommunity
	// LocalPref, when not nil, is the route's LOCAL_PREF (sent to internal
	// peers only; GoBGP removes it towards external ones).
	LocalPref *uint32
}

// LargeCommunity is an RFC 8092 community: global administrator and two
// local data parts.
type LargeCommunity struct{ ASN, Local1, Local2 uint32 }

// HostRoute is the route of one address alone, with no attributes.
func HostRoute(ip netip.Addr) Route {
	ip = ip.Unmap()
	return Route{Prefix: netip.PrefixFrom(ip, ip.BitLen())}
}

// Merge adds o's attributes to r (they announce the same prefix): the
// communities of both, and the higher LOCAL_PREF.
func (r *Route) Merge(o Route) {
	r.Communities = sortedUnion(r.Communities, o.Communities, cmp.Compare[uint32])
	r.LargeCommunities = sortedUnion(r.LargeCommunities, o.LargeCommunities, compareLarge)
	if o.LocalPref != nil && (r.LocalPref == nil || *o.LocalPref > *r.LocalPref) {
		lp := *o.LocalPref
		r.LocalPref = &lp
	}
}

// Equal reports whether r and o are the same route with the same
// attributes.
func (r Route) Equal(o Route) bool {
	return r.Prefix == o.Prefix && slices.Equal(r.Communities, o.Communities) &&
		slices.Equal(r.LargeCommunities, o.LargeCommunities) &&
		(r.LocalPref == nil) == (o.LocalPref == nil) && (r.LocalPref == nil || *r.LocalPref == *o.LocalPref)
}

// String is the route as an operator reads it:
// "203.0.113.0/24 communities 65000:100,no-export localPref 200".
func (r Route) String() string {
	var b strings.Builder
	b.WriteString(r.Prefix.String())
	if len(r.Communities) > 0 || len(r.LargeCommunities) > 0 {
		var cs []string
		for _, c := range r.Communities {
			cs = append(cs, formatCommunity(c))
		}
		for _, l := range r.LargeCommunities {
			cs = append(cs, fmt.Sprintf("large:%d:%d:%d", l.ASN, l.Local1, l.Local2))
		}
		b.WriteString(" communities ")
		b.WriteString(strings.Join(cs, ","))
	}
	if r.LocalPref != nil {
		fmt.Fprintf(&b, " localPref %d", *r.LocalPref)
	}
	return b.String()
}

// wellKnown are the RFC 1997 and RFC 3765 community names; local-as is
// the name some routers give no-export-subconfed.
var wellKnown = map[string]uint32{
	"no-export":           uint32(bgp.COMMUNITY_NO_EXPORT),
	"no-advertise":        uint32(bgp.COMMUNITY_NO_ADVERTISE),
	"no-export-subconfed": uint32(bgp.COMMUNITY_NO_EXPORT_SUBCONFED),
	"local-as":            uint32(bgp.COMMUNITY_NO_EXPORT_SUBCONFED),
	"no-peer":             uint32(bgp.COMMUNITY_NO_PEER),
}

func formatCommunity(c uint32) string {
	for _, name := range []string{"no-export", "no-advertise", "no-export-subconfed", "no-peer"} {
		if wellKnown[name] == c {
			return name
		}
	}
	return fmt.Sprintf("%d:%d", c>>16, c&0xffff)
}

// ParseCommunities parses communities as BGPAdvertisement takes them:
// "ASN:value" (each 0 to 65535), "large:ASN:local1:local2" (each 0 to
// 4294967295) or a well-known name. The results are sorted, without
// repeats.
func ParseCommunities(in []string) ([]uint32, []LargeCommunity, error) {
	var std []uint32
	var large []LargeCommunity
	for _, s := range in {
		if v, ok := wellKnown[s]; ok {
			std = append(std, v)
			continue
		}
		parts := strings.Split(s, ":")
		switch {
		case len(parts) == 2:
			hi, err1 := strconv.ParseUint(parts[0], 10, 16)
			lo, err2 := strconv.ParseUint(parts[1], 10, 16)
			if err1 != nil || err2 != nil {
				return nil, nil, fmt.Errorf("community %q: want ASN:value, each 0 to 65535", s)
			}
			std = append(std, uint32(hi)<<16|uint32(lo))
		case len(parts) == 4 && parts[0] == "large":
			var v [3]uint32
			for i, p := range parts[1:] {
				n, err := strconv.ParseUint(p, 10, 32)
				if err != nil {
					return nil, nil, fmt.Errorf("large community %q: want large:ASN:local1:local2, each 0 to 4294967295", s)
				}
				v[i] = uint32(n)
			}
			large = append(large, LargeCommunity{v[0], v[1], v[2]})
		default:
			return nil, nil, fmt.Errorf("community %q: want ASN:value, large:ASN:local1:local2 or a well-known name (no-export, no-advertise, no-export-subconfed, no-peer)", s)
		}
	}
	return sortedUnion(nil, std, cmp.Compare[uint32]),
		sortedUnion(nil, large, compareLarge), nil
}

// attrs are the route's optional path attributes, in GoBGP's form.
func (r Route) attrs() []bgp.PathAttributeInterface {
	var out []bgp.PathAttributeInterface
	if r.LocalPref != nil {
		out = append(out, bgp.NewPathAttributeLocalPref(*r.LocalPref))
	}
	if len(r.Communities) > 0 {
		out = append(out, bgp.NewPathAttributeCommunities(slices.Clone(r.Communities)))
	}
	if len(r.LargeCommunities) > 0 {
		var ls []*bgp.LargeCommunity
		for _, l := range r.LargeCommunities {
			ls = append(ls, bgp.NewLargeCommunity(l.ASN, l.Local1, l.Local2))
		}
		out = append(out, bgp.NewPathAttributeLargeCommunities(ls))
	}
	return out
}

func compareLarge(a, b LargeCommunity) int {
	return cmp.Or(cmp.Compare(a.ASN, b.ASN), cmp.Compare(a.Local1, b.Local1), cmp.Compare(a.Local2, b.Local2))
}

// sortedUnion is a and b together, sorted, without repeats (a new slice).
func sortedUnion[T comparable](a, b []T, cmp func(T, T) int) []T {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := append(slices.Clone(a), b...)
	slices.SortFunc(out, cmp)
	return slices.Compact(out)
}
