package nft

import (
	"bytes"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// This file builds the table's fixed chains and sets: created with the
// table, or brought in line with a table the kernel holds.

// writeFixed creates the table with its fixed chains and sets, when the
// kernel has none; with replace, it replaces a table the kernel holds as a
// whole, atomically: add (so that the delete cannot fail), delete, and
// re-create. Replacing drops every affinity entry and counter: it is only
// for a table that cannot be reconciled in place.
func (t *tx) writeFixed(replace bool) error {
	c, tb := t.conn, t.b.table
	c.AddTable(tb)
	if replace {
		c.DelTable(tb)
		c.AddTable(tb)
	}
	for _, s := range fixedSets(tb) {
		t.b.sets[s.Name] = s
		if err := t.addSet(s, nil); err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
	}
	for _, cs := range baseChains {
		t.addBaseChain(cs)
	}
	for _, name := range regularChains {
		c.AddChain(&nftables.Chain{Name: name, Table: tb})
	}
	rules := fixedRules(t.b.cfg)
	for _, cs := range baseChains {
		t.addRules(cs.name, rules[cs.name])
	}
	for _, name := range regularChains {
		t.addRules(name, rules[name])
	}
	t.stats.Messages += 3 + len(t.b.sets) + len(baseChains) + len(regularChains)
	return nil
}

func (t *tx) addBaseChain(cs chainSpec) {
	prio := nftables.ChainPriority(cs.priority)
	policy := nftables.ChainPolicyAccept
	t.conn.AddChain(&nftables.Chain{Name: cs.name, Table: t.b.table, Type: cs.typ, Hooknum: cs.hook, Priority: &prio, Policy: &policy})
}

// reconcileFixed brings the fixed chains and sets of a table the kernel
// holds in line: missing ones are created, fixed chains whose rules differ
// (another configuration) are rewritten, and everything else is left as
// it is.
func (t *tx) reconcileFixed() error {
	k, tb := t.kernel, t.b.table
	for _, s := range fixedSets(tb) {
		t.b.sets[s.Name] = s
		if k.sets[s.Name] == nil {
			if err := t.addSet(s, nil); err != nil {
				return fmt.Errorf("set %s: %w", s.Name, err)
			}
			t.stats.Messages++
		}
	}
	for _, cs := range baseChains {
		if !k.chains[cs.name] {
			t.addBaseChain(cs)
			t.stats.Messages++
		}
	}
	for _, name := range regularChains {
		if !k.chains[name] {
			t.conn.AddChain(&nftables.Chain{Name: name, Table: tb})
			t.stats.Messages++
		}
	}
	rules := fixedRules(t.b.cfg)
	names := []string{}
	for _, cs := range baseChains {
		names = append(names, cs.name)
	}
	for _, name := range append(names, regularChains...) {
		want := rules[name]
		if k.rules[name] == len(want) && (len(want) == 0 || bytes.Equal(k.tags[name], t.b.fixedTag(name))) {
			continue
		}
		if k.rules[name] > 0 {
			t.conn.FlushChain(&nftables.Chain{Name: name, Table: tb})
			t.stats.Messages++
		}
		t.addRules(name, want)
	}
	return nil
}

func (t *tx) addRules(chain string, rules [][]expr.Any) {
	ch := &nftables.Chain{Name: chain, Table: t.b.table}
	tag := t.b.fixedTag(chain)
	for _, r := range rules {
		t.conn.AddRule(&nftables.Rule{Table: t.b.table, Chain: ch, Exprs: r, UserData: tag})
		t.stats.Messages++
	}
}
