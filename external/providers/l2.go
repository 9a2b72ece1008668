package providers

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/portal"
)

// L2 answers for the IPs this node owns: l2.Owner over the eligible
// nodes whose agents are alive, kept by idx as the cluster changes
// (l2owners.go). When the live nodes of an IP change and this node stays
// its owner, it announces the IP again: a node that starts before it has
// seen the others' Leases may briefly claim an IP and announce it, and
// only the owner's announcement puts clients right.
type L2 struct {
	r   Answerer
	idx *l2Owners
	// last is the state last told (Update), which a change of liveness
	// alone (FollowLiveness) is looked at with.
	last *State
	// own is what this node answered for at the last look (nil before
	// the first): an IP it takes over from another node is told to
	// tookOver (an event on its Services).
	own      map[netip.Addr]bool
	tookOver func(ip netip.Addr, from string, svcs []portal.ServiceKey)
	// conflicts keeps one node answering for an IP: a probe before a
	// takeover, a yield or a defence on hearing another (l2conflict.go).
	conflicts l2Conflicts
}

// Answerer is what the L2 provider tells which IPs to answer for: the
// responder (*l2.Responder).
type Answerer interface {
	Set(ips []netip.Addr)
	Reannounce(ips []netip.Addr)
	Owned() []netip.Addr
	Close()
}

// L2Options are what the L2 provider works with beside its responder.
type L2Options struct {
	// Liveness is the nodes' liveness: who is heard answering, and who
	// said it stops.
	Liveness *leases.Liveness
	// Probe asks who answers for IPs before a takeover (the responder's
	// Probe); nil: no probe.
	Probe func([]netip.Addr, time.Duration) map[netip.Addr]net.HardwareAddr
	// TookOver, when set, is told each IP this node takes over from
	// another, with the Services holding it.
	TookOver func(ip netip.Addr, from string, svcs []portal.ServiceKey)
	// Poke wakes the hook to look again (a node yields).
	Poke func()
	Log  *slog.Logger
	// Stopping, when set, says this node is stopping.
	Stopping func() bool
}

// NewL2 is the provider of the responder r; r's OnConflict is to call
// Heard.
func NewL2(r Answerer, o L2Options) *L2 {
	return &L2{r: r, idx: newL2Owners(), tookOver: o.TookOver, conflicts: l2Conflicts{announce: r.Reannounce, probe: o.Probe, lv: o.Liveness,
		poke: o.Poke, log: o.Log, stopping: o.Stopping}}
}

// Heard handles another host (mac) announcing ip, which this node answers
// for.
func (p *L2) Heard(ip netip.Addr, mac net.HardwareAddr) { p.conflicts.heard(ip, mac) }

// Announced is how many IPs this node answers for.
func (p *L2) Announced() int { return len(p.r.Owned()) }

// Owner is the node that owns ip at the last look ("" when none, or ip is
// not an L2 address).
func (p *L2) Owner(ip netip.Addr) string { return p.idx.owner(ip) }

// OwnedBy are the addresses node owns at the last look, unsorted.
func (p *L2) OwnedBy(node string) []netip.Addr { return p.idx.ownedBy(node) }

// Name is "l2".
func (p *L2) Name() string { return "l2" }

// Update answers for the IPs this node owns in s.
func (p *L2) Update(_ context.Context, s *State) error {
	p.conflicts.told(s)
	p.last = s
	p.idx.update(s)
	p.settle(s)
	return nil
}

// FollowLiveness looks again when only the nodes' liveness changed (a
// Lease expired or came back, a node was heard): the cost of a takeover
// is then what moved (l2Owners), not the cluster's size.
func (p *L2) FollowLiveness() {
	if p.last == nil {
		return
	}
	p.idx.syncLiveness(p.last.Alive)
	p.settle(p.last)
}

// settle tells the responder what this node answers for now that the
// index moved what it moved, probing first for the IPs it takes over
// from a node judged dead.
func (p *L2) settle(s *State) {
	m := p.idx.take()
	var before func(netip.Addr) string
	if p.own != nil {
		before = func(ip netip.Addr) string {
			if was, ok := m.owners[ip]; ok {
				return was
			}
			return p.idx.owner(ip)
		}
	}
	own := p.owned(s)
	took := tookOver(s, before, p.own, own)
	if kept := p.conflicts.probeTakeovers(s, took, own); len(kept) < len(own) {
		// The nodes heard answering a probe are alive now: that is
		// taken at once, as part of this look, so that a node heard
		// again each lease duration does not make this one announce
		// its IPs again, and this node does not take what they answer
		// for.
		p.idx.syncLiveness(s.Alive)
		m.then(p.idx.take())
		keep := map[netip.Addr]bool{}
		for _, ip := range kept {
			keep[ip] = true
		}
		own = slices.DeleteFunc(p.owned(s), func(ip netip.Addr) bool { return took[ip] != "" && !keep[ip] })
		took = tookOver(s, before, p.own, own)
	}
	var again []netip.Addr
	changed := p.idx.changedGroups(m)
	for _, ip := range own {
		if p.own[ip] && (m.regrouped[ip] || changed[p.idx.ips[ip].group]) {
			again = append(again, ip)
		}
	}
	p.r.Set(own)
	p.r.Reannounce(again)
	if p.tookOver != nil {
		for ip, from := range took {
			p.tookOver(ip, from, holders(s, ip))
		}
	}
	p.own = make(map[netip.Addr]bool, len(own))
	for _, ip := range own {
		p.own[ip] = true
	}
}

// owned are the IPs this node owns and serves, sorted.
func (p *L2) owned(s *State) []netip.Addr {
	own := slices.DeleteFunc(p.idx.ownedBy(s.Node), func(ip netip.Addr) bool { return !s.Serves(ip) })
	slices.SortFunc(own, netip.Addr.Compare)
	return own
}

// L2Owner is the node that owns ip in s (l2.Owner over the eligible nodes
// alive that the advertisements let answer for it), and those nodes.
func L2Owner(s *State, ip netip.Addr) (string, []string) {
	var live []string
	for _, n := range s.Eligible(ip) {
		if s.Alive(n) && s.view.Ann.L2Allows(ip, n) {
			live = append(live, n)
		}
	}
	return l2.Owner(ip, live), live
}

// Close stops answering.
func (p *L2) Close(context.Context) error { p.r.Close(); return nil }
