package nft

import (
	"net/netip"

	"github.com/google/nftables"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// A sync is one transaction (tx): the Services' differences from what was
// applied become kernel operations and the state to adopt. tx_diff.go diffs
// the Services and the node's addresses, tx_chains.go and tx_fixed.go build
// the chains and sets, tx_reconcile.go turns a full sync into the difference
// from what the kernel holds, and tx_commit.go sends it all and adopts it.

// tx collects one sync's changes: kernel operations in the order the kernel
// needs them, and the in-memory state to adopt if the kernel accepts them.
type tx struct {
	b    *Backend
	conn *nftables.Conn
	// sender holds the library's messages, so that messages of onehop's
	// own (sets and their elements: appendOwn) go between them, and sends
	// them all at commit.
	sender *batchSender
	setIDs uint32 // the last set id allocated (addSet)
	full   bool

	services  map[portal.ServiceKey]*appliedService // nil value: deleted
	owners    map[string]*portal.PortKey            // nil value: released
	refD      map[string]int                        // shared element id -> change of its reference count
	npIPs     []netip.Addr
	npChanged bool
	podIPs    []portal.PodExternalIP
	podIPsSet bool
	// svcCIDRs are the ranges of the service-cidrs sets after this sync,
	// when svcCIDRsSet.
	svcCIDRs    []netip.Prefix
	svcCIDRsSet bool

	newChains []string
	bodies    map[string]chainBody
	oldBodies map[string]chainBody // of rewritten and deleted chains
	newAff    map[string]uint32    // affinity maps created, re-timed or (full sync) kept -> timeout
	delAff    [][2]string          // affinity sets and chains deleted
	// kernel is the table as read by a full sync that reconciles in place
	// (nil otherwise): what it holds already is not sent again.
	kernel      *kernelState
	fullElems   int      // elements a full sync leaves in the table
	delLeftover []string // chains in the kernel that nothing wants
	delSets     []string // affinity sets in the kernel that nothing wants
	// rangeSets are the Services' sets of source ranges this sync creates,
	// refills or deletes, by name.
	rangeSets map[string]rangeSetChange
	err       error
	rewrite   map[string]bool // existing chains whose rules are replaced
	delChains []string
	addElems  map[string][]nftables.SetElement
	delElems  map[string][]nftables.SetElement

	// flatBound bounds the elements a full sync puts in the flat maps
	// (presize): beyond flatReadBackMax they are written anew, not read.
	flatBound int

	stats     dataplane.SyncStats
	conflicts int
	// waiting are elements another portal owned when their portal was
	// diffed; they are added at commit if that portal let them go.
	waiting []waitingElem
}

type waitingElem struct {
	pk portal.PortKey
	e  elem
}

// claimWaiting adds the waiting elements whose owner let them go in this
// sync, in the order they were asked for; the others are conflicts.
func (t *tx) claimWaiting() {
	for _, w := range t.waiting {
		if own, ok := t.otherOwner(w.pk, w.e); ok {
			t.conflicts++
			t.b.log.Warn("address already used by another service port; skipped",
				"portal", w.pk.String(), "owner", own.String(), "set", w.e.set)
			continue
		}
		t.addElems[w.e.set] = append(t.addElems[w.e.set], t.element(w.e, true))
		if w.e.eps != nil {
			t.flatAdd(w.e)
		}
		key := w.pk
		t.owners[w.e.ownerID()] = &key
	}
}

// newTx starts a transaction that builds its messages on conn and sends
// them through sender (newTxConn).
func (b *Backend) newTx(conn *nftables.Conn, sender *batchSender, full bool) *tx {
	return &tx{
		b: b, conn: conn, sender: sender, full: full,
		services:  map[portal.ServiceKey]*appliedService{},
		owners:    map[string]*portal.PortKey{},
		refD:      map[string]int{},
		bodies:    map[string]chainBody{},
		oldBodies: map[string]chainBody{},
		newAff:    map[string]uint32{},
		rewrite:   map[string]bool{},
		addElems:  map[string][]nftables.SetElement{},
		delElems:  map[string][]nftables.SetElement{},
		rangeSets: map[string]rangeSetChange{},
	}
}

// presize gives a full sync's maps and element lists their size up front.
// A table of 10k Services x 10 endpoints has 100k endpoint elements and
// about 40k addresses and ports: grown by doubling, their lists and maps
// were copied and collected again and again, about a fifth of the sync's
// allocations.
func (t *tx) presize(snap *portal.Snapshot) {
	n := len(snap.Services)
	t.services = make(map[portal.ServiceKey]*appliedService, n)
	t.bodies = make(map[string]chainBody, n)
	t.owners = make(map[string]*portal.PortKey, 4*n)
	var eps, vips [2]int // endpoints and cluster IP ports per family
	for _, svc := range snap.Services {
		for _, p := range svc.Portals {
			i := 0
			if p.Key.Family == portal.IPv6 {
				i = 1
			}
			eps[i] += len(p.ClusterEndpoints)
			vips[i] += len(p.ClusterIPs)
			if len(p.ClusterEndpoints) <= maxFlat {
				t.flatBound += len(p.ClusterEndpoints) * waysIn(p)
			}
		}
	}
	for i, f := range []portal.Family{portal.IPv4, portal.IPv6} {
		if vips[i] > 0 { // each goes to its chain, or to drop or reject
			t.addElems[setVIPs(f)] = make([]nftables.SetElement, 0, vips[i])
		}
		if eps[i] == 0 {
			continue
		}
		per := eps[i]/endpointShards + eps[i]/endpointShards/4 + 8 // ids spread unevenly
		for shard := range uint32(endpointShards) {
			t.addElems[setEndpoints(f, shard)] = make([]nftables.SetElement, 0, per)
		}
	}
}

// pendingElems is the number of element changes the sync has collected so
// far (a full sync that reads back sends fewer: those the kernel lacks).
func (t *tx) pendingElems() int {
	n := 0
	for _, els := range t.addElems {
		n += len(els)
	}
	for _, els := range t.delElems {
		n += len(els)
	}
	return n
}

func (t *tx) oldService(k portal.ServiceKey) *appliedService {
	if t.full {
		return nil
	}
	return t.b.services[k]
}

// otherOwner returns the portal other than pk that owns e or, for a
// firewall element, the way in it guards: a way in another portal holds
// is never checked against pk's source ranges.
func (t *tx) otherOwner(pk portal.PortKey, e elem) (portal.PortKey, bool) {
	if own, ok := t.owner(e.ownerID()); ok && own != pk {
		return own, true
	}
	if ids, ok := firewallGuard(e); ok {
		var other portal.PortKey
		for _, id := range ids {
			if own, ok := t.owner(id); ok {
				if own == pk {
					return portal.PortKey{}, false
				}
				other = own
			}
		}
		return other, true
	}
	return portal.PortKey{}, false
}

func (t *tx) owner(id string) (portal.PortKey, bool) {
	if o, ok := t.owners[id]; ok {
		if o == nil {
			return portal.PortKey{}, false
		}
		return *o, true
	}
	if t.full {
		return portal.PortKey{}, false
	}
	o, ok := t.b.owners[id]
	return o, ok
}
