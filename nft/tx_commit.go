package nft

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// This file sends a transaction to the kernel, in the order the kernel
// needs it, and adopts its state in memory once the kernel accepted it.

// elemChunkBytes bounds the size of the element list in one netlink
// message: a nested attribute's length is 16 bits, and an overflow would
// silently truncate the list.
const elemChunkBytes = 48 << 10

// commit sends the transaction and, when the kernel accepts it, adopts the
// new state in memory.
func (t *tx) commit() (dataplane.SyncStats, error) {
	t.claimWaiting()
	// Shared elements: added or deleted when their count crosses zero.
	for id, d := range t.refD {
		if d == 0 {
			continue
		}
		before := 0
		if !t.full {
			before = t.b.refs[id]
		}
		after := before + d
		set, key, _ := strings.Cut(id, "\x00")
		switch {
		case before <= 0 && after > 0:
			t.addElems[set] = append(t.addElems[set], nftables.SetElement{Key: []byte(key)})
		case before > 0 && after <= 0:
			t.delElems[set] = append(t.delElems[set], nftables.SetElement{Key: []byte(key)})
		}
	}

	if err := t.writeRangeSets(); err != nil {
		return t.stats, err
	}
	sort.Strings(t.newChains)
	for _, name := range t.newChains {
		if t.kernel != nil && t.kernel.chains[name] {
			continue // a full sync in place: emitRules compares its rules
		}
		t.conn.AddChain(&nftables.Chain{Name: name, Table: t.b.table})
		t.stats.Messages++
	}
	names := make([]string, 0, len(t.bodies))
	for name := range t.bodies {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if t.rewrite[name] {
			t.conn.FlushChain(&nftables.Chain{Name: name, Table: t.b.table})
			t.stats.Messages++
			t.dropEndpoints(name, t.oldBodies[name])
		}
		t.chainRules(name, t.bodies[name])
	}
	for _, name := range t.delChains {
		t.dropEndpoints(name, t.oldBodies[name])
		t.b.releaseID(name)
	}
	if t.kernel != nil {
		t.reconcileKernel()
	}
	if err := t.setElems(t.delElems, false); err != nil {
		return t.stats, err
	}
	if err := t.setElems(t.addElems, true); err != nil {
		return t.stats, err
	}
	sort.Strings(t.delChains)
	gone := append(slices.Clone(t.delChains), t.delLeftover...)
	for _, name := range gone {
		t.conn.FlushChain(&nftables.Chain{Name: name, Table: t.b.table})
	}
	for _, name := range gone {
		t.conn.DelChain(&nftables.Chain{Name: name, Table: t.b.table})
	}
	t.stats.Messages += 2 * len(gone)
	for _, name := range t.delSets {
		t.conn.DelSet(&nftables.Set{Table: t.b.table, Name: name})
		t.stats.Messages++
	}
	t.deleteRangeSets()
	for _, o := range t.delAff {
		t.conn.DelChain(&nftables.Chain{Name: o[1], Table: t.b.table})
		t.conn.DelSet(&nftables.Set{Table: t.b.table, Name: o[0]})
		t.stats.Messages += 2
	}
	if t.err != nil {
		return t.stats, t.err
	}

	if t.stats.Messages > 0 {
		err := t.conn.Flush()
		if err == nil {
			err = t.sender.sendHeld()
		}
		if err != nil {
			return t.stats, fmt.Errorf("nftables transaction (%d messages): %w", t.stats.Messages, err)
		}
	}
	t.adopt()
	return t.stats, nil
}

func (t *tx) setElems(m map[string][]nftables.SetElement, add bool) error {
	names := make([]string, 0, len(m))
	for s := range m {
		names = append(names, s)
	}
	sort.Strings(names)
	for _, s := range names {
		if err := t.sendElems(t.b.sets[s], m[s], add); err != nil {
			return err
		}
	}
	return nil
}

// sendElems adds or deletes elements of one set, in messages of at most
// elemChunkBytes.
func (t *tx) sendElems(set *nftables.Set, els []nftables.SetElement, add bool) error {
	for len(els) > 0 {
		n, size := 0, 0
		for n < len(els) && size+elemLen(set, &els[n]) <= elemChunkBytes {
			size += elemLen(set, &els[n])
			n++
		}
		n = max(n, 1)
		chunk := els[:n]
		els = els[n:]
		t.stats.Messages++
		if err := t.appendOwn(elemMessage(set, chunk, add)); err != nil {
			return fmt.Errorf("set %s: %w", set.Name, err)
		}
	}
	return nil
}

// addSet creates s, with els when it is constant (an anonymous set), in a
// message of onehop's own (setMessage): the library cannot declare the
// types nft prints a set's keys by (setUserData). Sets get their ids,
// which elements and lookups in the same transaction may refer to, from
// the transaction.
func (t *tx) addSet(s *nftables.Set, els []nftables.SetElement) error {
	t.setIDs++
	s.ID = t.setIDs
	if s.Anonymous {
		s.Name = "__set%d" // the kernel numbers it
		if s.IsMap {
			s.Name = "__map%d"
		}
	}
	m, err := setMessage(s, len(els), setUserData(s))
	if err != nil {
		return err
	}
	msgs := []netlink.Message{m}
	if len(els) > 0 {
		msgs = append(msgs, elemMessage(s, els, true))
	}
	return t.appendOwn(msgs...)
}

// appendOwn adds messages of onehop's own to the transaction, after the
// library's messages so far.
func (t *tx) appendOwn(msgs ...netlink.Message) error {
	if err := t.conn.Flush(); err != nil { // the sender holds them
		return err
	}
	t.sender.appendHeld(msgs...)
	return nil
}

func (t *tx) adopt() {
	b := t.b
	if t.full {
		ids, free, next := b.ids, b.freeIDs, b.nextID
		b.reset()
		// Chain ids were allocated afresh while building this transaction.
		b.ids, b.freeIDs, b.nextID = ids, free, next
		// Nothing was applied before: the maps are taken as they are, or
		// sized, instead of grown entry by entry.
		b.services = make(map[portal.ServiceKey]*appliedService, len(t.services))
		b.owners = make(map[string]portal.PortKey, len(t.owners))
	}
	b.synced = true
	for k, s := range t.services {
		if s == nil {
			delete(b.services, k)
		} else {
			b.services[k] = s
		}
	}
	for id, o := range t.owners {
		if o == nil {
			delete(b.owners, id)
		} else {
			b.owners[id] = *o
		}
	}
	for id, d := range t.refD {
		if n := b.refs[id] + d; n > 0 {
			b.refs[id] = n
		} else {
			delete(b.refs, id)
		}
	}
	if t.npChanged {
		b.npIPs = t.npIPs
	}
	if t.podIPsSet {
		b.podIPs = t.podIPs
	}
	if t.svcCIDRsSet {
		b.svcCIDRs = t.svcCIDRs
	}
	for _, o := range t.delAff {
		delete(b.affSets, o[0])
	}
	for aff, timeout := range t.newAff {
		b.affSets[aff] = timeout
	}
	b.chains += len(t.newChains) - len(t.delChains)
	for _, els := range t.addElems {
		b.elements += len(els)
	}
	for _, els := range t.delElems {
		b.elements -= len(els)
	}
	if t.kernel != nil {
		b.elements = t.fullElems
	}
	t.stats.Rules = b.chains // per-portal chains hold one or two rules each
	t.stats.Elements = b.elements
}
