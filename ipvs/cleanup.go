package ipvs

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Cleanup implements dataplane.Dataplane: it removes onehop's IPVS services
// (those on the dummy's VIPs or recorded in the state file), the dummy
// interface, onehop's iptables chains and jumps, its ipsets, and the state
// file.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	have, err := b.readKernel()
	if err != nil {
		errs = append(errs, err)
	} else {
		for k, v := range have.Servers {
			if err := b.ipvs.DelService(toService(v)); err != nil && !isNotExist(err) {
				errs = append(errs, fmt.Errorf("ipvs: removing %s: %w", k, err))
			}
		}
	}
	if l, err := b.nl.LinkByName(DummyInterface); err == nil {
		if err := b.nl.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("ipvs: deleting %s: %w", DummyInterface, err))
		}
	}
	for _, t := range b.ipt {
		if err := t.cleanup(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := b.sets.destroyAll(); err != nil { // after the rules that use them
		errs = append(errs, err)
	}
	removeState(b.stateFile)
	b.applied, b.synced, b.drains = nil, false, map[drainKey]time.Time{}
	return errors.Join(errs...)
}
