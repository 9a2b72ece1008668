package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// A Service's loadBalancerSourceRanges are one interval set per family,
// sr<f>/<namespace>/<name>, and one chain per family, fw<f>/<namespace>/<name>,
// whose one rule drops a client outside the set. The ways in it guards
// jump there from the services chain (elements of @fw<f> and
// @fw-nodeports<f>) before they are dispatched: the Service costs one chain
// and one rule whatever its number of ports and ranges, one element per
// guarded way in and two per range. A change of the ranges refills the set
// and touches no rule; other Services' syncs, which make the kernel
// validate every chain a jump reaches, do not walk a chain per port.

// rangeSetChange is what a sync does to one set of source ranges.
type rangeSetChange struct {
	family portal.Family
	ranges []netip.Prefix
	// existed: the kernel holds the set already (it is refilled, not
	// created); del: nothing wants it any more.
	existed, del bool
}

// rangeSetObj is the declaration of a set of source ranges.
func (b *Backend) rangeSetObj(name string, f portal.Family) *nftables.Set {
	return &nftables.Set{Table: b.table, Name: name, Interval: true, KeyType: addrType(f)}
}

// serviceRangeSets returns the sets of source ranges a Service's portals
// use, by name. The portals of one Service and family carry the same
// ranges; were they to differ, the first portal in key order would win.
func serviceRangeSets(objs map[portal.PortKey]*objects) map[string]rangeSetChange {
	keys := make([]portal.PortKey, 0, len(objs))
	for pk, o := range objs {
		if o.rangeSet != "" {
			keys = append(keys, pk)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	out := map[string]rangeSetChange{}
	for _, pk := range keys {
		o := objs[pk]
		if _, ok := out[o.rangeSet]; !ok {
			out[o.rangeSet] = rangeSetChange{family: pk.Family, ranges: o.ranges}
		}
	}
	return out
}

// diffRangeSets records the set changes of one Service.
func (t *tx) diffRangeSets(oldObjs, newObjs map[portal.PortKey]*objects) {
	old, cur := serviceRangeSets(oldObjs), serviceRangeSets(newObjs)
	for name, n := range cur {
		o, had := old[name]
		if had && slices.Equal(o.ranges, n.ranges) {
			continue
		}
		n.existed = had
		t.rangeSets[name] = n
	}
	for name, o := range old {
		if _, ok := cur[name]; !ok {
			o.del = true
			t.rangeSets[name] = o
		}
	}
}

// writeRangeSets creates and refills the sets of source ranges, and creates
// their firewall chains, before any element that jumps there is sent. A
// full sync over a table that holds a set with the same elements and its
// chain with the same rule sends nothing for them.
func (t *tx) writeRangeSets() error {
	names := make([]string, 0, len(t.rangeSets))
	for name, c := range t.rangeSets {
		if !c.del {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		c := t.rangeSets[name]
		want := rangeElements(c.ranges)
		set := t.b.rangeSetObj(name, c.family)
		existed := c.existed
		if k := t.kernel; k != nil {
			existed = k.sets[name] != nil
		}
		if !existed || t.kernel == nil || !sameIntervals(want, t.kernel.elems[name]) {
			if existed {
				t.conn.FlushSet(set)
			} else if err := t.addSet(set, nil); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
			t.stats.Messages++
			if err := t.sendElems(set, want, true); err != nil {
				return err
			}
		}
		t.firewallChain(name, c)
	}
	return nil
}

// firewallChain writes the chain that drops a client outside the set of
// source ranges named set, unless it exists already with that rule:
//
//	chain fw4/<namespace>/<name>
//	    ip saddr != @sr4/<namespace>/<name> counter drop
func (t *tx) firewallChain(set string, c rangeSetChange) {
	name := firewallChain(set)
	tag := ruleTag(0, "fw|"+set)
	ch := &nftables.Chain{Name: name, Table: t.b.table}
	switch k := t.kernel; {
	case k != nil && k.chains[name]:
		if k.rules[name] == 1 && bytes.Equal(k.tags[name], tag) {
			return
		}
		if k.rules[name] > 0 {
			t.conn.FlushChain(ch)
			t.stats.Messages++
		}
	case k == nil && c.existed:
		return // refilled: the rule stays as it is
	default:
		t.conn.AddChain(ch)
		t.stats.Messages++
	}
	t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, UserData: tag, Exprs: cat(matchFamily(c.family), []expr.Any{
		loadAddr(c.family, false, reg1), lookup(set, true), counter(), verdict(expr.VerdictDrop, ""),
	})})
	t.stats.Messages++
}

// deleteRangeSets deletes the sets nothing wants any more, with their
// firewall chains, after the elements that jumped there.
func (t *tx) deleteRangeSets() {
	var names []string
	for name, c := range t.rangeSets {
		if c.del {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		ch := &nftables.Chain{Name: firewallChain(name), Table: t.b.table}
		t.conn.FlushChain(ch)
		t.conn.DelChain(ch)
		t.conn.DelSet(&nftables.Set{Table: t.b.table, Name: name})
		t.stats.Messages += 3
	}
}

// wantsRangeSet reports whether this (full) sync keeps the named set.
func (t *tx) wantsRangeSet(name string) bool {
	c, ok := t.rangeSets[name]
	return ok && !c.del
}

// sameIntervals reports whether the kernel holds exactly the wanted
// elements of an interval set (in any order).
func sameIntervals(want, have []nftables.SetElement) bool {
	if len(want) != len(have) {
		return false
	}
	key := func(e nftables.SetElement) string {
		if e.IntervalEnd {
			return string(e.Key) + "\x01"
		}
		return string(e.Key) + "\x00"
	}
	w := make([]string, len(want))
	h := make([]string, len(have))
	for i := range want {
		w[i], h[i] = key(want[i]), key(have[i])
	}
	slices.Sort(w)
	slices.Sort(h)
	return slices.Equal(w, h)
}

// checkRangeSet reports whether the kernel's declaration of a set named as
// a set of source ranges is the one this version creates.
func checkRangeSet(s *setDecl) error {
	f := portal.IPv4
	if strings.HasPrefix(s.name, rangeSetPrefix+"6") {
		f = portal.IPv6
	}
	if s.isMap() || s.flags&unix.NFT_SET_INTERVAL == 0 || int(s.keyLen) != addrLen(f) {
		return fmt.Errorf("set %s has another type than this version uses", s.name)
	}
	return nil
}
