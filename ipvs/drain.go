package ipvs

import (
	"net/netip"
	"slices"
	"time"
)

type drainKey struct {
	vs   vsKey
	dest netip.AddrPort
}

// Reap deletes drained destinations: those with no connections left, or
// drained for longer than the drain timeout. Check calls it; Sync too.
func (b *Backend) reapLocked(now time.Time) {
	if len(b.drains) == 0 {
		return
	}
	byVS := map[vsKey][]netip.AddrPort{}
	for dk := range b.drains {
		byVS[dk.vs] = append(byVS[dk.vs], dk.dest)
	}
	for k, dests := range byVS {
		v := b.applied.Servers[k]
		svc := &virtualServer{Key: k, Sched: b.sched}
		if v != nil {
			svc = v
		}
		ds, err := b.ipvs.GetDestinations(toService(svc))
		if err != nil {
			b.log.Warn("ipvs: reading draining destinations", "service", k.String(), "err", err)
			continue
		}
		conns := map[netip.AddrPort]int{}
		present := map[netip.AddrPort]bool{}
		for _, d := range ds {
			if ap, ok := destAddr(d); ok {
				conns[ap] = d.ActiveConnections + d.InactiveConnections
				present[ap] = true
			}
		}
		for _, d := range dests {
			dk := drainKey{k, d}
			if present[d] && conns[d] > 0 && now.Sub(b.drains[dk]) < b.drainTimeout {
				continue
			}
			if present[d] {
				if err := b.ipvs.DelDestination(toService(svc), toDest(d, 0)); err != nil && !isNotExist(err) {
					b.log.Warn("ipvs: removing drained destination", "service", k.String(), "dest", d.String(), "err", err)
					continue
				}
			}
			delete(b.drains, dk)
			if v != nil && v.Dests[d] == 0 {
				delete(v.Dests, d)
			}
			b.log.Debug("ipvs: destination drained", "service", k.String(), "dest", d.String(), "connections", conns[d])
		}
	}
}

// Draining returns the destinations currently kept at weight 0.
func (b *Backend) Draining() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for dk := range b.drains {
		out = append(out, dk.vs.String()+" -> "+dk.dest.String())
	}
	slices.Sort(out)
	return out
}
