package l2

import (
	"math/rand/v2"
	"net/netip"
	"time"
)

// Periodic announcements: with an interval set (SetPeriodic), the
// responder announces every IP it owns again every interval, give or take
// the jitter, drawn afresh each time so that the nodes' announcements do
// not fall into step. Off by default: an owner announces an IP when it
// takes it over, in a burst, and when it defends it.

// periodic is the schedule of the periodic announcements.
type periodic struct {
	every, jitter time.Duration
	// rnd is in [0, 1).
	rnd func() float64
}

// next is the wait until the next round: every, plus or minus up to
// jitter.
func (p periodic) next() time.Duration {
	if p.jitter <= 0 {
		return p.every
	}
	return p.every - p.jitter + time.Duration(p.rnd()*float64(2*p.jitter))
}

// run announces the IPs owned (owned) in a round (announce) after each
// wait (after), until done is closed.
func (p periodic) run(done <-chan struct{}, after func(time.Duration) <-chan time.Time, owned func() []netip.Addr, announce func(netip.Addr)) {
	for {
		select {
		case <-done:
			return
		case <-after(p.next()):
		}
		for _, ip := range owned() {
			announce(ip)
		}
	}
}

// SetPeriodic makes the responder announce every IP it owns again every
// interval, give or take jitter, until Close; an interval of 0 leaves
// it off. It is called once, before the responder's IPs are set.
func (r *Responder) SetPeriodic(every, jitter time.Duration) {
	if every <= 0 {
		return
	}
	p := periodic{every: every, jitter: min(jitter, every/2), rnd: rand.Float64}
	r.log.Info("l2: periodic announcements on", "every", every, "jitter", p.jitter)
	r.wg.Go(func() {
		p.run(r.done, time.After, r.Owned, r.announce)
	})
}
