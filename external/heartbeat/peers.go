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
//
// A peer whose last datagram said it restarts is held: alive for up to
// the restart hold after it, as long as its node answers echo requests,
// each less than timeout after the one before (Echoed). Its agent is gone
// for a while, but its node's kernel still forwards what the agent gave
// it: the peers keep its IPs where they are instead of moving them away
// and back, which breaks the connections that open meanwhile. A node that
// stops answering is dead at once; one that answers but sends no
// heartbeat is dead when the hold ends.
type Peers struct {
	timeout time.Duration
	hold    time.Duration
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
	// holdUntil: the incarnation inc said it restarts; echoed is when its
	// node last answered an echo request.
	holdUntil time.Time
	echoed    time.Time
}

// NewPeers judges a peer dead when none of its datagrams was taken for
// timeout.
func NewPeers(timeout time.Duration) *Peers {
	return &Peers{timeout: timeout, peers: map[string]*peer{}}
}

// SetRestartHold sets how long a peer that said it restarts stays alive
// while its node answers echo requests (0, the default: it is taken as
// leaving).
func (p *Peers) SetRestartHold(d time.Duration) { p.hold = max(d, 0) }

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
	was := pr.alive && p.liveLocked(pr, now)
	pr.holdUntil, pr.echoed = time.Time{}, time.Time{}
	if m.Leaving || m.Restarting && p.hold == 0 {
		pr.last, pr.alive, pr.leftAtInc = now, false, true
		return was, nil
	}
	if m.Restarting {
		pr.holdUntil = now.Add(p.hold)
	}
	pr.last, pr.alive, pr.leftAtInc = now, true, false
	return !was, nil
}

// liveLocked: pr's last datagram is less than timeout old, or pr is held
// (the type's comment) and its node answered an echo request less than
// timeout ago.
func (p *Peers) liveLocked(pr *peer, now time.Time) bool {
	if pr.leftAtInc || pr.last.IsZero() {
		return false
	}
	if now.Sub(pr.last) < p.timeout {
		return true
	}
	return now.Before(pr.holdUntil) && now.Sub(later(pr.last, pr.echoed)) < p.timeout
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Held returns the peers held now: those whose node the caller sends echo
// requests to.
func (p *Peers) Held(now time.Time) []string {
	var out []string
	for n, pr := range p.peers {
		if pr.heard && pr.alive && now.Before(pr.holdUntil) {
			out = append(out, n)
		}
	}
	return out
}

// Echoed records that node answered an echo request at now. It keeps a
// held peer alive only (the type's comment).
func (p *Peers) Echoed(node string, now time.Time) {
	if pr := p.peers[node]; pr != nil && now.Before(pr.holdUntil) {
		pr.echoed = later(pr.echoed, now)
	}
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
// it did not say it leaves), or while it is held (the type's comment).
// last is when that one came (when it said it leaves, if it did).
func (p *Peers) State(node string, now time.Time) (alive, known bool, last time.Time) {
	pr := p.peers[node]
	if pr == nil || !pr.heard {
		return false, false, time.Time{}
	}
	return p.liveLocked(pr, now), true, pr.last
}

// Expire marks dead, and returns, the peers alive at the last look whose
// last datagram is timeout old at now: those that missed their datagrams,
// or, held, whose node stopped answering echo requests or whose hold
// ended.
func (p *Peers) Expire(now time.Time) (dead []string) {
	for n, pr := range p.peers {
		if pr.alive && !p.liveLocked(pr, now) {
			// A held peer found dead stays so: a late echo reply does
			// not bring its IPs back.
			pr.alive, pr.holdUntil = false, time.Time{}
			dead = append(dead, n)
		}
	}
	return dead
}
