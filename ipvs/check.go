package ipvs

import (
	"context"
	"fmt"
	"net"
	"time"
)

// Check implements dataplane.Dataplane: the dummy interface must still be
// there and up (netlink, every Check), and the iptables jumps and chains
// (`iptables -C`, at most once per canary period, see WithCanaryPeriod, so
// that a Check every second does not compete for the xtables lock). It also
// deletes drained destinations, so that draining is bounded even when no
// Sync comes.
func (b *Backend) Check(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.synced {
		return nil
	}
	b.reapLocked(time.Now())
	b.sets.reap()
	l, err := b.nl.LinkByName(DummyInterface)
	if err != nil {
		return fmt.Errorf("ipvs: %s is gone: %w", DummyInterface, err)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("ipvs: %s is down", DummyInterface)
	}
	if now := time.Now(); b.canaryPeriod <= 0 || now.Sub(b.canaryAt) >= b.canaryPeriod {
		b.canaries++
		for fam, t := range b.activeIPT() {
			if err := t.checkBase(fam, b.sets != nil); err != nil {
				return err // canaryAt stays: the next Check looks again
			}
		}
		b.canaryAt = now
	}
	return nil
}
