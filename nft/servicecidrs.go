package nft

import (
	"net/netip"
	"slices"

	"github.com/google/nftables"

	"github.com/onehop/onehop/portal"
)

// The ranges cluster IPs come from are one interval set per family,
// service-cidrs4 and service-cidrs6: the snapshot's ServiceCIDRs (every
// ServiceCIDR object's spec.cidrs) with dataplane.Config.ServiceCIDRs
// (--service-cidr) added. The noep-check chain, which new connections
// pass after DNAT, rejects one to an allocated cluster IP whose port no
// Service defines and then drops one to an address of the sets, as
// kube-proxy does:
//
//	ip daddr @cluster-ips4 goto reject
//	ip daddr @service-cidrs4 counter drop
//
// These rules never change. A range added or removed at run time changes
// the set's elements only, and only those of the spans it touches: the
// ranges are merged into disjoint spans of two elements each (start and
// end), and a span that is not in both the old and the new list is
// deleted or added whole. A range added costs its own span plus the
// neighbours it merges with (two at most), a range removed its span or
// the one it splits; the number of other ranges and Services does not
// count.

func setServiceCIDRs(f portal.Family) string { return "service-cidrs" + fam(f) }

// serviceCIDRElems are the elements of the set of family f for ranges.
func serviceCIDRElems(ranges []netip.Prefix, f portal.Family) []nftables.SetElement {
	var of []netip.Prefix
	for _, p := range ranges {
		if portal.FamilyOf(p.Addr()) == f {
			of = append(of, p)
		}
	}
	return rangeElements(of)
}

// spans groups interval elements as rangeElements makes them: a start,
// followed by its end unless the span reaches the family's last address.
func spans(els []nftables.SetElement) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	for i := 0; i < len(els); i++ {
		n := 1
		if i+1 < len(els) && els[i+1].IntervalEnd {
			n = 2
		}
		out = append(out, els[i:i+n])
		i += n - 1
	}
	return out
}

func sameSpan(a, b []nftables.SetElement) bool {
	return slices.EqualFunc(a, b, func(x, y nftables.SetElement) bool {
		return x.IntervalEnd == y.IntervalEnd && string(x.Key) == string(y.Key)
	})
}

// serviceCIDRs diffs the sets of Service CIDRs with what the backend
// applied (a full sync adds everything; reconcileKernel then compares with
// what the kernel holds). The unit of change is a whole span: moving only
// the end of one would, for a moment inside the transaction, put an end
// inside another span, which the kernel refuses.
func (t *tx) serviceCIDRs(ranges []netip.Prefix) {
	want := portal.UnionCIDRs(append(slices.Clone(t.b.cfg.ServiceCIDRs), ranges...))
	var old []netip.Prefix
	if !t.full {
		old = t.b.svcCIDRs
		if slices.Equal(old, want) {
			return
		}
	}
	for _, f := range families {
		s := setServiceCIDRs(f)
		was, now := spans(serviceCIDRElems(old, f)), spans(serviceCIDRElems(want, f))
		for _, sp := range was {
			if !slices.ContainsFunc(now, func(o []nftables.SetElement) bool { return sameSpan(o, sp) }) {
				t.delElems[s] = append(t.delElems[s], sp...)
			}
		}
		for _, sp := range now {
			if !slices.ContainsFunc(was, func(o []nftables.SetElement) bool { return sameSpan(o, sp) }) {
				t.addElems[s] = append(t.addElems[s], sp...)
			}
		}
	}
	t.svcCIDRs, t.svcCIDRsSet = want, true
}
