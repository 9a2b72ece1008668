package ipvs

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// Sync implements dataplane.Dataplane. It computes the whole desired state
// in memory (cheap) and sends the kernel only the differences: against what
// the previous sync applied, or, on a full sync, against what the kernel
// holds. IPVS has no transactions: on error the kernel may hold part of the
// change, and the next (full) sync converges it.
//
// One Service's trouble is that Service's: a scheduler the kernel lacks is
// replaced by the default before anything is sent, a virtual server the
// kernel refuses is left out (and tried again by every sync) while the
// others are programmed, and both are in SyncStats.Problems.
func (b *Backend) Sync(ctx context.Context, snap *portal.Snapshot, full bool) (dataplane.SyncStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sp := newSyncProblems()
	st, err := b.sync(snap, full, sp)
	st.Problems = b.report(sp)
	return st, err
}

func (b *Backend) sync(snap *portal.Snapshot, full bool, sp *syncProblems) (dataplane.SyncStats, error) {
	start := time.Now()
	full = full || !b.synced || b.needFull
	st := dataplane.SyncStats{Full: full, Services: len(snap.Services)}
	if !full {
		st.Services = len(snap.Dirty)
	}
	b.needFull = true // cleared on success
	nodeAddrs, err := b.nodePortAddrs(snap.Node)
	if err != nil {
		return st, err
	}
	in := planInput{Cfg: b.cfg, Sched: b.sched, NodeAddrs: nodeAddrs}
	if !full && !slices.Equal(nodeAddrs, b.nodeAddrs) {
		full, st.Full, st.Services = true, true, len(snap.Services) // every NodePort moves
	}
	if !full && !b.v6 {
		for _, k := range snap.Dirty {
			if s := snap.Services[k]; s != nil && slices.ContainsFunc(s.Portals, func(p *portal.Portal) bool { return p != nil && p.Key.Family == portal.IPv6 }) {
				full, st.Full, st.Services = true, true, len(snap.Services) // sets up the IPv6 chains
			}
		}
	}
	// The Services this sync looks at: their schedulers are asked about
	// before anything is planned, and their problems are reported.
	var looked []portal.ServiceKey
	if full {
		b.forgetRefusals()
		looked = slices.Collect(maps.Keys(snap.Services))
		for k := range b.problems {
			sp.looked[k] = true // gone Services' problems end
		}
	} else {
		looked = append(slices.Clone(snap.Dirty), b.failingServices()...)
		if b.applied != nil {
			looked = b.applied.expandDirty(looked)
		}
	}
	for _, k := range looked {
		sp.looked[k] = true
	}
	in.Refused = b.refusedSchedulers(snap.Services, looked)
	// whole is the complete desired plan; have and want are what the diff
	// looks at: everything on a full sync, only the keys the dirty
	// Services had or now have on an incremental one.
	var whole, have, want *plan
	stateChanged := true
	if full {
		whole = buildPlan(in, snap.Services)
		want = whole
	} else {
		whole = b.applied
		dirty := looked // expanded, with the failing Services
		t := newTouched()
		scratch := newPlan()
		for _, k := range dirty {
			t.addPart(whole.Parts[k])
			if s := snap.Services[k]; s != nil {
				scratch.addService(in, k, s)
			}
		}
		for _, pt := range scratch.Parts {
			t.addPart(pt)
		}
		have = whole.subset(t)
		before := labels(whole, t, dirty, scratch)
		whole.replace(in, dirty, snap.Services)
		want = whole.subset(t)
		stateChanged = before != labels(whole, t, dirty, scratch)
	}
	st.Panics = whole.Panics // left out; the runner reports them
	sp.schedulerProblems(b, snap.Services)
	for _, c := range whole.Conflicts {
		b.log.Warn("ipvs: entry not programmed", "conflict", c)
	}
	for k, v := range want.Servers {
		if b.ipt[k.family()] == nil {
			return st, fmt.Errorf("ipvs: %s needs ip6tables, which is missing", v.Portal)
		}
		if k.family() == portal.IPv6 {
			b.v6 = true
		}
	}
	batches := map[portal.Family]batch{}
	if full {
		if err := b.setup(); err != nil {
			return st, err
		}
		if have, err = b.readKernel(); err != nil {
			return st, err
		}
		if !b.synced {
			b.logForeign(have.Foreign, want)
		}
		if !b.v6 && !b.synced && b.ipt[portal.IPv6] != nil {
			// A previous process had IPv6 Services: reconcile (and
			// remove, if they are gone) its ip6tables rules too.
			if tr, err := b.ipt[portal.IPv6].snapshot("nat"); err == nil {
				_, b.v6 = tr[chainPostrouting]
			}
		}
		for fam, t := range b.activeIPT() {
			tables, err := t.tablesNow()
			if err != nil {
				return st, err
			}
			bt := batch{}
			t.ensureBase(b.cfg, fam, tables, bt, b.sets != nil)
			readRules(fam, have, tables)
			batches[fam] = bt
		}
	}
	changed := map[portal.PortKey]bool{}
	msgs, err := b.applyServers(have, want, !full, changed, sp)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	if full {
		if b.host, err = b.hostAddrs(); err != nil {
			return st, err
		}
	}
	haveFilter, wantFilter := have.Filter, filterOf(want, b.host)
	if !full {
		haveFilter = filterOf(have, b.host)
	}
	msgs, err = b.sets.applyFilter(haveFilter, wantFilter, slices.Collect(maps.Keys(b.activeIPT())))
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	msgs, err = b.applyVIPs(have, want)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	msgs, err = b.sets.apply(have, want)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	msgs, err = b.applyRules(have, want, batches)
	st.Messages += msgs
	if err != nil {
		return st, err
	}
	st.Messages += b.sets.destroyStale(have, want)
	if stateChanged {
		b.saveState(whole)
	}
	// Keep the draining destinations in the applied state: they are in the kernel.
	for dk := range b.drains {
		if v := whole.Servers[dk.vs]; v != nil {
			if _, ok := v.Dests[dk.dest]; !ok {
				v.Dests[dk.dest] = 0
			}
		}
	}
	b.applied, b.nodeAddrs, b.synced, b.needFull = whole, nodeAddrs, true, false
	if full {
		b.canaryAt = time.Now() // the full sync made the chains whole
	}
	st.Changed = len(changed)
	st.Rules = len(whole.Rules)
	for _, v := range whole.Servers {
		st.Elements += 1 + len(v.Dests)
	}
	for _, c := range whole.Sets {
		st.Elements += len(c.Nets)
	}
	b.reapLocked(time.Now())
	st.Duration = time.Since(start)
	return st, nil
}

// setup sets the sysctls (see doc.go for why each) and creates the dummy
// interface.
func (b *Backend) setup() error {
	if err := setSysctls(); err != nil {
		return err
	}
	_, err := b.ensureDummy()
	return err
}

// labels summarises what the state file records for the touched servers
// and the dirty Services' local endpoints, to rewrite it only on change.
func labels(pl *plan, t *touched, dirty []portal.ServiceKey, scratch *plan) string {
	var out []string
	for k := range t.servers {
		if v := pl.Servers[k]; v != nil {
			out = append(out, k.String()+" "+v.Portal.String()+" "+v.Kind)
		}
	}
	ports := map[string]bool{}
	for _, k := range dirty {
		if pt := pl.Parts[k]; pt != nil {
			for _, l := range pt.Local {
				ports[l] = true
			}
		}
	}
	for _, pt := range scratch.Parts {
		for _, l := range pt.Local {
			ports[l] = true
		}
	}
	for p := range ports {
		out = append(out, p+" "+fmt.Sprint(pl.Local[p])+" "+pl.Topology[p])
	}
	slices.Sort(out)
	return fmt.Sprint(out)
}
