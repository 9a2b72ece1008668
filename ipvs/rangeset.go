package ipvs

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/portal"
)

// rangeSet is one ipset of source ranges: the sorted, distinct networks
// (hash:net cannot hold a /0, so it holds the two halves instead).
type rangeSet struct {
	Family portal.Family
	Nets   []netip.Prefix
}

func (s rangeSet) equal(o rangeSet) bool { return s.Family == o.Family && slices.Equal(s.Nets, o.Nets) }

// addRangeSet adds (or refers again to) the set of p's source ranges and
// returns its name. It is named for the Service and family, so that a change
// of ranges is a diff of its elements; a portal of the same Service and
// family with other ranges (the builder never makes one) gets its own.
func (pl *plan) addRangeSet(p *portal.Portal, pt *part) string {
	rs := rangeSet{Family: p.Key.Family}
	for _, r := range p.SourceRanges {
		r = r.Masked()
		if !r.IsValid() || portal.FamilyOf(r.Addr()) != p.Key.Family || r.Addr().Is4In6() {
			continue // another family's, or not expressible in the set: left out, so not allowed
		}
		if r.Bits() == 0 { // hash:net refuses /0: the two halves
			lo, hi := splitZero(r.Addr().BitLen())
			rs.Nets = append(rs.Nets, lo, hi)
			continue
		}
		rs.Nets = append(rs.Nets, r)
	}
	slices.SortFunc(rs.Nets, comparePrefix)
	rs.Nets = slices.Compact(rs.Nets)
	name := rangeSetName(p.Key.Service.String(), p.Key.Family)
	if old, ok := pl.Sets[name]; ok && !old.equal(rs) {
		name = rangeSetName(p.Key.String(), p.Key.Family)
	}
	if !slices.Contains(pt.Sets, name) {
		pl.Sets[name] = rs
		pl.SetRefs[name]++
		pt.Sets = append(pt.Sets, name)
	}
	return name
}

func splitZero(bits int) (netip.Prefix, netip.Prefix) {
	if bits == 32 {
		return netip.MustParsePrefix("0.0.0.0/1"), netip.MustParsePrefix("128.0.0.0/1")
	}
	return netip.MustParsePrefix("::/1"), netip.MustParsePrefix("8000::/1")
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// rangeSetName is ONEHOP-RANGES- and 16 hex digits (ipset names have at
// most 31 characters).
func rangeSetName(owner string, fam portal.Family) string {
	h := sha256.Sum256([]byte(owner + " " + fam.String()))
	return rangeSetPrefix + strings.ToUpper(hex.EncodeToString(h[:])[:16])
}
