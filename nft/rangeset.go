package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// A Service's loadBalancerSourceRanges are one interval set per family,
// sr<f>/<namespace>/<name>, which every fw chain of the Service looks the
// client up in: the Service costs two rules per fw chain and two elements
// per range, instead of one rule per range and port. A change of the
// ranges refills the set and touches no rule.

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

// writeRangeSets creates and refills the sets of source ranges, before any
// rule that looks them up is sent. A full sync over a table that holds a
// set with the same elements sends nothing for it.
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
			if existed && sameIntervals(want, k.elems[name]) {
				continue
			}
		}
		if existed {
			t.conn.FlushSet(set)
		} else if err := t.conn.AddSet(set, nil); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
		t.stats.Messages++
		if err := t.sendElems(set, want, true); err != nil {
			return err
		}
	}
	return nil
}

// deleteRangeSets deletes the sets nothing wants any more, after the
// chains that looked them up.
func (t *tx) deleteRangeSets() {
	var names []string
	for name, c := range t.rangeSets {
		if c.del {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		t.conn.DelSet(&nftables.Set{Table: t.b.table, Name: name})
		t.stats.Messages++
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
