package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/portal"
)

// kernelState reads back what the backend owns, as a full sync reads it,
// from every family whose iptables exists.
func kernelState(b *Backend) (*plan, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	have, err := b.readKernel()
	if err != nil {
		return nil, err
	}
	for fam, t := range b.ipt {
		tables, err := t.tablesNow()
		if err != nil {
			return nil, err
		}
		readRules(fam, have, tables)
	}
	return have, nil
}

// compare checks the kernel against a full plan of the snapshot and
// against the model's ways in.
func (m *churnModel) compare(tb *backend, snap *portal.Snapshot) string {
	var have *plan
	var draining []string
	var sched string
	var pending map[string]bool
	if err := tb.do(func(b *Backend) (err error) {
		if have, err = kernelState(b); err != nil {
			return err
		}
		draining = b.Draining()
		b.mu.Lock()
		defer b.mu.Unlock()
		sched = b.sched
		if b.sets != nil {
			pending = maps.Clone(b.sets.pending)
		}
		return nil
	}); err != nil {
		return fmt.Sprintf("reading the kernel back: %v", err)
	}
	var nodeAddrs []netip.Addr
	nodeAddrs = append(nodeAddrs, snap.Node.NodePortAddrs...)
	want := buildPlan(planInput{Cfg: m.cfg, Sched: sched, NodeAddrs: nodeAddrs}, snap.Services)
	if len(want.Conflicts) > 0 {
		return fmt.Sprintf("the model made conflicting Services: %v", want.Conflicts)
	}
	var diffs []string
	for k, v := range want.Servers {
		h := have.Servers[k]
		if h == nil {
			diffs = append(diffs, fmt.Sprintf("missing virtual server %s (%s)", k, v.Portal))
			continue
		}
		if !h.sameService(v) {
			diffs = append(diffs, fmt.Sprintf("%s: scheduler %s timeout %d, want %s %d", k, h.Sched, h.Timeout, v.Sched, v.Timeout))
		}
		for d, w := range h.Dests {
			switch _, ok := v.Dests[d]; {
			case w == 0 && !slices.Contains(draining, k.String()+" -> "+d.String()):
				diffs = append(diffs, fmt.Sprintf("%s: %s at weight 0 but not draining", k, d))
			case w == 0 && ok:
				diffs = append(diffs, fmt.Sprintf("%s: endpoint %s at weight 0", k, d))
			case w != 0 && !ok:
				diffs = append(diffs, fmt.Sprintf("%s: stale destination %s", k, d))
			}
		}
		for d := range v.Dests {
			if _, ok := h.Dests[d]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: missing destination %s", k, d))
			}
		}
	}
	for k := range have.Servers {
		if want.Servers[k] == nil {
			diffs = append(diffs, fmt.Sprintf("stale virtual server %s", k))
		}
	}
	for a := range want.VIPs {
		if !have.VIPs[a] {
			diffs = append(diffs, fmt.Sprintf("VIP %s not on %s", a, DummyInterface))
		}
	}
	for a := range have.VIPs {
		if !want.VIPs[a] {
			diffs = append(diffs, fmt.Sprintf("stale VIP %s", a))
		}
	}
	for k := range want.Rules {
		if _, ok := have.Rules[k]; !ok {
			diffs = append(diffs, "missing rule "+k)
		}
	}
	for k := range have.Rules {
		if _, ok := want.Rules[k]; !ok {
			diffs = append(diffs, "stale rule "+k)
		}
	}
	for name := range pending {
		if _, ok := want.Sets[name]; ok {
			diffs = append(diffs, fmt.Sprintf("wanted ipset %s is waiting to be destroyed", name))
		}
	}
	if w, h := churnSetLines(want, nil), churnSetLines(have, pending); w != h {
		diffs = append(diffs, fmt.Sprintf("source ranges differ:\nkernel:\n%s\nwant:\n%s", h, w))
	}
	// The model's ways in, independently of the plan.
	for _, w := range m.ways() {
		h := have.Servers[w.key]
		if h == nil {
			diffs = append(diffs, fmt.Sprintf("model: no virtual server for %s of %v", w.key, w.svc.key))
			continue
		}
		var live []netip.AddrPort
		for d, wt := range h.Dests {
			if wt > 0 {
				live = append(live, d)
			}
		}
		slices.SortFunc(live, netip.AddrPort.Compare)
		wantSched := cmpOr(w.svc.sched, sched)
		if !slices.Equal(live, w.eps) || h.Sched != wantSched || h.Timeout != w.svc.affinity {
			diffs = append(diffs, fmt.Sprintf("model: %s of %v holds %v %s %d, want %v %s %d", w.key, w.svc.key, live, h.Sched, h.Timeout, w.eps, wantSched, w.svc.affinity))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	slices.Sort(diffs)
	return fmt.Sprintf("the kernel differs from a full plan of the same snapshot and from the model:\n\t%s", strings.Join(diffs, "\n\t"))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// churnSetLines renders the source-range sets of a plan for comparison,
// leaving out the ones waiting to be destroyed.
func churnSetLines(pl *plan, pending map[string]bool) string {
	var lines []string
	for name, c := range pl.Sets {
		if !pending[name] {
			lines = append(lines, fmt.Sprintf("%s %s %v", c.Family, name, c.Nets))
		}
	}
	for name := range pl.SRChains {
		lines = append(lines, "chain "+name)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
