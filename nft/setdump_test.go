package nft

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/onehop/onehop/portal"
)

// The kernel dumps a hash set in parts, each resuming by skipping as many
// elements as the parts before it held; a set that grows or shrinks
// rehashes in the background, in another order, so a dump taken then can
// hold some elements twice and miss as many others. Both readers of the
// sets' elements (the full sync's, whose every repeated element it would
// delete, and dump-rules') return exactly what the set holds: sets that
// grow and shrink by thousands of elements are read right after each
// change, before the kernel has rehashed them.
func TestSetDumpWhileTheKernelRehashes(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 0)
	b, ctx := tp.b, context.Background()
	if _, err := b.Sync(ctx, &portal.Snapshot{Services: map[portal.ServiceKey]*portal.Service{}}, true); err != nil {
		t.Fatal(err)
	}
	set := b.sets[setHairpin(portal.IPv4)]
	conn, err := newConn(tp.node.FD())
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) []byte {
		a := netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)})
		return pairKey(a, a)
	}
	held := map[string]bool{}
	change := func(from, to int, add bool) {
		t.Helper()
		var els []nftables.SetElement
		for i := from; i < to; i++ {
			els = append(els, nftables.SetElement{Key: key(i)})
			if add {
				held[string(key(i))] = true
			} else {
				delete(held, string(key(i)))
			}
		}
		for c := range slices.Chunk(els, 1000) {
			if add {
				err = conn.SetAddElements(set, c)
			} else {
				err = conn.SetDeleteElements(set, c)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := conn.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	check := func(round int, who string, els []nftables.SetElement) {
		t.Helper()
		got := map[string]int{}
		for _, e := range els {
			got[string(e.Key)]++
		}
		var msg []string
		for k, n := range got {
			if n > 1 {
				msg = append(msg, fmt.Sprintf("%x %d times", k, n))
			}
			if !held[k] {
				msg = append(msg, fmt.Sprintf("%x, which the set does not hold", k))
			}
		}
		for k := range held {
			if got[k] == 0 {
				msg = append(msg, fmt.Sprintf("not %x", k))
			}
		}
		if len(msg) > 0 {
			slices.Sort(msg)
			t.Fatalf("round %d: %s read %d elements of %d: %v", round, who, len(els), len(held), msg[:min(len(msg), 10)])
		}
	}
	const rounds, size = 40, 4000
	for round := range rounds {
		// Grow from a few hundred to thousands, then shrink back.
		if round%2 == 0 {
			change(300, size, true)
		} else {
			change(300, size, false)
		}
		if round == 0 {
			change(0, 300, true)
		}
		d, err := b.newElemDumper()
		if err != nil {
			t.Fatal(err)
		}
		els, err := d.dump(set.Name, 0)
		d.close()
		if err != nil {
			t.Fatal(err)
		}
		check(round, "the full sync", els)
		k, err := readKernel(tp.node.FD(), b.table)
		if err != nil {
			t.Fatal(err)
		}
		check(round, "dump-rules", k.elems[set.Name])
	}
}

func TestRepeatsElement(t *testing.T) {
	el := func(key string, end bool) nftables.SetElement {
		return nftables.SetElement{Key: []byte(key), IntervalEnd: end}
	}
	for _, c := range []struct {
		els  []nftables.SetElement
		want bool
	}{
		{nil, false},
		{[]nftables.SetElement{el("a", false), el("b", false), el("c", false)}, false},
		{[]nftables.SetElement{el("a", false), el("b", false), el("a", false)}, true},
		// An interval's end may have the key the next interval starts at.
		{[]nftables.SetElement{el("a", false), el("b", true), el("b", false)}, false},
		{[]nftables.SetElement{el("a", false), el("b", true), el("b", true)}, true},
	} {
		if got := repeatsElement(c.els); got != c.want {
			t.Errorf("repeatsElement(%v) = %v, want %v", c.els, got, c.want)
		}
	}
}
