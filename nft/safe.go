package nft

import (
	"fmt"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// serviceSafely is (*tx).serviceRendered for the sync loop, with a panic confined
// to the one Service that raised it.
//
// Rendering is pure, so Service k's portals are first rendered on their
// own: a panic there leaves the transaction untouched, and k is then
// diffed as deleted (its objects leave the kernel, nothing new is added)
// and reported in the sync's stats, while every other Service syncs. The
// diff then uses those rendered objects: nothing is rendered twice.
//
// A panic in the diff itself, after rendering, may leave part of k's
// changes in the transaction, which must then not be committed: the sync
// fails (the kernel keeps its previous state) and the panic is reported.
func (t *tx) serviceSafely(k portal.ServiceKey, svc *portal.Service) {
	var rendered map[portal.PortKey]*objects
	if svc != nil && t.renders(k, svc) {
		if p := dataplane.CatchServicePanic("nft", k, func() { rendered = t.renderService(svc) }); p != nil {
			t.stats.Panics = append(t.stats.Panics, *p)
			svc, rendered = nil, nil
		}
	}
	if p := dataplane.CatchServicePanic("nft", k, func() { t.serviceRendered(k, svc, rendered) }); p != nil {
		t.stats.Panics = append(t.stats.Panics, *p)
		if t.err == nil {
			t.err = fmt.Errorf("nft: diffing Service %s: %w", k, p.Err)
		}
	}
}

// renders reports whether serviceRendered will render svc: not when it equals
// what was applied.
func (t *tx) renders(k portal.ServiceKey, svc *portal.Service) bool {
	old := t.oldService(k)
	return old == nil || (old.svc != svc && !old.svc.Equal(svc))
}
