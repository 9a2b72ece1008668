package heartbeat

import (
	"errors"
	"time"
)

// ErrNotPeer: a datagram names a node that is not a peer.
var ErrNotPeer = errors.New("heartbeat: not a peer")

// Peers is what this node knows of each peer's heartbeats: the pure part,
// judged at the moments the caller passes.
//
// A peer is alive while its last datagram taken is less than timeout old
// (the interval times the datagrams that may be missed). A peer never
// heard from is not known: the caller judges it otherwise (by its Lease).
type Peers struct {
	timeout time.Duration
	peers   map[string]*peer
}

type peer struct {
	// heard: its heartbeats decide (State's known); floor: inc and seq
	// are the newest taken, below which nothing is taken again.
	heard     bool
	floor     bool
	inc, seq  uint64
	last      time.Time
	alive     bool // as last reported (Accept, Expire)
	leftAtInc bool // the incarnation inc said it leaves
}

// NewPeers judges a peer dead when none of its datagrams was taken for
// timeout.
func NewPeers(timeout time.Duration) *Peers {
	return &Peers{timeout: timeout, peers: map[string]*peer{}}
}

// SetMembers makes names the peers: those new are not known until heard,
// those left out are forgotten.
func (p *Peers) SetMembers(names []string) {
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
		if p.peers[n] == nil {
			p.peers[n] = &peer{}
		}
	}
	for n := range p.peers {
		if !keep[n] {
			delete(p.peers, n)
		}
	}
}

// Accept takes m, received at now, unless it is not newer than the last
// datagram taken from its sender: the same incarnation with a sequence
// number not above the last, or an older incarnation (ErrReplay). changed
// says that the sender became alive, or dead (it leaves).
func (p *Peers) Accept(m Message, now time.Time) (changed bool, err error) {
	pr := p.peers[m.Node]
	if pr == nil {
		return false, ErrNotPeer
	}
	if pr.floor && (m.Incarnation < pr.inc || m.Incarnation == pr.inc && m.Seq <= pr.seq) {
		return false, ErrReplay
	}
	pr.heard, pr.floor, pr.inc, pr.seq = true, true, m.Incarnation, m.Seq
	was := pr.alive && now.Sub(pr.last) < p.timeout
	if m.Leaving {
		pr.last, pr.alive, pr.leftAtInc = now, false, true
		return was, nil
	}
	pr.last, pr.alive, pr.leftAtInc = now, true, false
	return !was, nil
}

// Unverified makes node's heartbeats decide nothing until one is taken
// again, and reports whether they decided until now: a datagram from its
// address failed authentication (another key: it restarted with a key the
// others lack), and the caller judges it otherwise. Nothing older than
// what was taken from it is taken afterwards.
func (p *Peers) Unverified(node string) bool {
	pr := p.peers[node]
	if pr == nil || !pr.heard {
		return false
	}
	pr.heard, pr.alive = false, false
	return true
}

// Left says whether node's last datagram taken said it leaves (a clean
// stop), and no newer one came.
func (p *Peers) Left(node string) bool {
	pr := p.peers[node]
	return pr != nil && pr.heard && pr.leftAtInc
}

// State is node's heartbeat liveness at now: known once a datagram of it
// was taken; then alive while the last one is less than timeout old (and
// it did not say it leaves). last is when that one came (when it said
// it leaves, if it did).
func (p *Peers) State(node string, now time.Time) (alive, known bool, last time.Time) {
	pr := p.peers[node]
	if pr == nil || !pr.heard {
		return false, false, time.Time{}
	}
	return !pr.leftAtInc && !pr.last.IsZero() && now.Sub(pr.last) < p.timeout, true, pr.last
}

// Expire marks dead, and returns, the peers alive at the last look whose
// last datagram is timeout old at now: those that missed their datagrams.
func (p *Peers) Expire(now time.Time) (dead []string) {
	for n, pr := range p.peers {
		if pr.alive && now.Sub(pr.last) >= p.timeout {
			pr.alive = false
			dead = append(dead, n)
		}
	}
	return dead
}
