package nft

import (
	"sort"
	"strings"

	"github.com/google/nftables"
)

// This file makes a full sync that reads the table back send only the
// difference from what the kernel holds.

// reconcileKernel turns a full sync's "everything" into the difference
// from what the kernel holds: elements already there with the same value
// are not sent again, elements nothing wants are deleted, and so are the
// chains and affinity sets nothing wants any more.
func (t *tx) reconcileKernel() {
	k := t.kernel
	for _, s := range fixedSets(t.b.table) {
		want := t.addElems[s.Name]
		t.fullElems += len(want)
		if k.rewrite[s.Name] {
			// Not read back: emptied, and all of want sent after.
			t.conn.FlushSet(s)
			t.stats.Messages++
			continue
		}
		// Indexes, not copies of the elements: at 100k elements a map
		// of SetElement values was a sixth of a restart's allocations.
		wantAt := make(map[string]int32, len(want))
		for i := range want {
			wantAt[string(want[i].Key)] = int32(i)
		}
		kept, nKept := make([]bool, len(want)), 0
		have := k.elems[s.Name]
		for i := range have {
			if j, ok := wantAt[string(have[i].Key)]; ok && !kept[j] && elemEqual(want[j], have[i]) {
				kept[j] = true
				nKept++
				continue
			}
			// The end flag names an interval set's end element.
			t.delElems[s.Name] = append(t.delElems[s.Name], nftables.SetElement{Key: have[i].Key, IntervalEnd: have[i].IntervalEnd})
		}
		if nKept == 0 {
			continue
		}
		send := make([]nftables.SetElement, 0, len(want)-nKept)
		for i := range want {
			if !kept[i] {
				send = append(send, want[i])
			}
		}
		t.addElems[s.Name] = send
	}
	wanted := map[string]bool{}
	for _, cs := range baseChains {
		wanted[cs.name] = true
	}
	for _, name := range regularChains {
		wanted[name] = true
	}
	for name := range t.bodies {
		wanted[name] = true
	}
	for name, c := range t.rangeSets {
		if !c.del {
			wanted[firewallChain(name)] = true
		}
	}
	for set := range t.newAff {
		wanted[kindAffinityEndpoint+strings.TrimPrefix(set, affinitySetPrefix)] = true
	}
	for name := range k.chains {
		if !wanted[name] {
			t.delLeftover = append(t.delLeftover, name)
		}
	}
	sort.Strings(t.delLeftover)
	for name := range k.sets {
		if _, ok := t.newAff[name]; !ok && t.b.sets[name] == nil && !t.wantsRangeSet(name) {
			t.delSets = append(t.delSets, name)
		}
	}
	sort.Strings(t.delSets)
}
