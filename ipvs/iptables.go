package ipvs

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// iptables wraps one family's iptables binary. onehop only ever changes the
// chains it owns (ONEHOP-IPVS-*, ONEHOP-SR-*) and the jump rules to them from
// nat POSTROUTING, filter INPUT and filter OUTPUT.
type iptables struct {
	t           *goipt.IPTables
	cmd         string // iptables or ip6tables, for whole-table listings
	randomFully bool
}

func newIPTables(fam portal.Family) (*iptables, error) {
	proto := goipt.ProtocolIPv4
	if fam == portal.IPv6 {
		proto = goipt.ProtocolIPv6
	}
	t, err := goipt.New(goipt.IPFamily(proto), goipt.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("ipvs: %s iptables: %w", fam, err)
	}
	cmd := "iptables"
	if fam == portal.IPv6 {
		cmd = "ip6tables"
	}
	return &iptables{t: t, cmd: cmd, randomFully: t.HasRandomFully()}, nil
}

// entryChains are the order-independent chains whose rules the plan lists.
var entryChains = []struct{ table, chain string }{
	{"nat", chainMasqExt}, {"nat", chainKeepSource}, {"nat", chainHairpin}, {"filter", chainInput}, {"filter", chainOutput},
}

// jumps lead from the built-in chains to onehop's; those marked filter only
// when the Service IP filter is on (it needs ipsets).
var jumps = []struct {
	table, from, to string
	filter          bool
}{
	{"nat", "POSTROUTING", chainPostrouting, false},
	{"filter", "INPUT", chainInput, false},
	{"filter", "INPUT", chainFilter, true},
	{"filter", "OUTPUT", chainOutput, false},
}

func jumpSpec(to string) []string {
	return []string{"-m", "comment", "--comment", jumpComment, "-j", to}
}

// tableRules is one `iptables -S` of a whole table: the chains and their
// rules (as specs, without -A CHAIN).
type tableRules map[string][][]string

// snapshot lists a whole table in one command; it is much cheaper than a
// listing per chain (each iptables run costs a process and a ruleset fetch).
func (i *iptables) snapshot(table string) (tableRules, error) {
	out, err := exec.Command(i.cmd, "-w", "5", "-t", table, "-S").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("ipvs: %s -t %s -S: %w", i.cmd, table, err)
	}
	tr := tableRules{}
	for _, l := range strings.Split(string(out), "\n") {
		f := splitRule(l)
		switch {
		case len(f) >= 2 && (f[0] == "-N" || f[0] == "-P"):
			if _, ok := tr[f[1]]; !ok {
				tr[f[1]] = nil
			}
		case len(f) >= 2 && f[0] == "-A":
			tr[f[1]] = append(tr[f[1]], f[2:])
		}
	}
	return tr, nil
}

// batch collects iptables commands per table, to be applied by one
// iptables-restore --noflush per table: one process and one atomic
// transaction instead of a process per rule.
type batch map[string][]string

func (bt batch) add(table string, args ...string) {
	q := make([]string, len(args))
	for n, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'\\") {
			a = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + `"`
		}
		q[n] = a
	}
	bt[table] = append(bt[table], strings.Join(q, " "))
}

// commit applies the batch; it returns the number of commands run.
func (i *iptables) commit(bt batch) (int, error) {
	n := 0
	for _, table := range []string{"nat", "filter"} {
		lines := bt[table]
		if len(lines) == 0 {
			continue
		}
		n++
		in := "*" + table + "\n" + strings.Join(lines, "\n") + "\nCOMMIT\n"
		cmd := exec.Command(i.cmd+"-restore", "--noflush", "-w", "5")
		cmd.Stdin = strings.NewReader(in)
		if out, err := cmd.CombinedOutput(); err != nil {
			return n, fmt.Errorf("ipvs: %s-restore: %w: %s\ninput:\n%s", i.cmd, err, out, in)
		}
	}
	return n, nil
}

// ensureBase adds to bt what creates onehop's chains, rewrites the fixed
// postrouting (and, withFilter, Service IP filter) chain when it differs,
// and adds the jumps from the built-in chains, given the tables as they are.
func (i *iptables) ensureBase(cfg dataplane.Config, fam portal.Family, tables map[string]tableRules, bt batch, withFilter bool) {
	fixed := []struct {
		table, chain string
		rules        [][]string
	}{{"nat", chainPostrouting, postroutingRules(cfg, fam, i.randomFully)}}
	if withFilter {
		fixed = append(fixed, struct {
			table, chain string
			rules        [][]string
		}{"filter", chainFilter, filterRules(fam)})
	}
	for _, c := range fixed {
		if _, ok := tables[c.table][c.chain]; !ok {
			bt.add(c.table, "-N", c.chain)
		}
	}
	for _, c := range entryChains {
		if _, ok := tables[c.table][c.chain]; !ok {
			bt.add(c.table, "-N", c.chain)
		}
	}
	for _, c := range fixed {
		if have := tables[c.table][c.chain]; !slices.EqualFunc(have, c.rules, slices.Equal) {
			// A fixed chain of a few rules: flush and refill in the same
			// transaction, so no packet sees it half-written.
			bt.add(c.table, "-F", c.chain)
			for _, r := range c.rules {
				bt.add(c.table, append([]string{"-A", c.chain}, r...)...)
			}
		}
	}
	for _, j := range jumps {
		if j.filter && !withFilter {
			continue
		}
		if !slices.ContainsFunc(tables[j.table][j.from], func(r []string) bool { return slices.Equal(r, jumpSpec(j.to)) }) {
			bt.add(j.table, append([]string{"-I", j.from, "1"}, jumpSpec(j.to)...)...)
		}
	}
}

// tablesNow lists nat and filter.
func (i *iptables) tablesNow() (map[string]tableRules, error) {
	tables := map[string]tableRules{}
	for _, table := range []string{"nat", "filter"} {
		tr, err := i.snapshot(table)
		if err != nil {
			return nil, err
		}
		tables[table] = tr
	}
	return tables, nil
}

// checkBase reports a missing jump or chain (iptables -C fails when the
// target chain is gone, too).
func (i *iptables) checkBase(fam portal.Family, withFilter bool) error {
	for _, j := range jumps {
		if j.filter && !withFilter {
			continue
		}
		ok, err := i.t.Exists(j.table, j.from, jumpSpec(j.to)...)
		if err != nil || !ok {
			return fmt.Errorf("ipvs: %s jump %s/%s -> %s is gone (%v)", fam, j.table, j.from, j.to, err)
		}
	}
	return nil
}

// readRules adds the per-entry rules and SR chains in tables to pl.
func readRules(fam portal.Family, pl *plan, tables map[string]tableRules) {
	for _, c := range entryChains {
		for _, r := range tables[c.table][c.chain] {
			pl.addRule(rule{fam, c.table, c.chain, r})
		}
	}
	for c, rs := range tables["filter"] {
		if strings.HasPrefix(c, srChainPrefix) {
			pl.SRChains[c] = srChain{Family: fam, Rules: rs}
		}
	}
}

// applyRules adds the rule differences of every family to its batch and
// commits it. Source-range chains of older versions are deleted after the
// jumps to them.
func (b *Backend) applyRules(have, want *plan, batches map[portal.Family]batch) (int, error) {
	msgs := 0
	for fam, i := range b.activeIPT() {
		bt := batches[fam]
		if bt == nil {
			bt = batch{}
		}
		for _, k := range sortedKeys(want.Rules) {
			r := want.Rules[k]
			if _, ok := have.Rules[k]; ok || r.Family != fam {
				continue
			}
			bt.add(r.Table, append([]string{"-A", r.Chain}, r.Spec...)...)
		}
		for _, k := range sortedKeys(have.Rules) {
			r := have.Rules[k]
			if _, ok := want.Rules[k]; ok || r.Family != fam {
				continue
			}
			bt.add(r.Table, append([]string{"-D", r.Chain}, r.Spec...)...)
		}
		for _, name := range sortedKeys(have.SRChains) {
			if _, ok := want.SRChains[name]; ok || have.SRChains[name].Family != fam {
				continue
			}
			bt.add("filter", "-F", name)
			bt.add("filter", "-X", name)
		}
		n, err := i.commit(bt)
		msgs += n
		if err != nil {
			return msgs, err
		}
	}
	return msgs, nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// cleanup removes the jumps and every chain onehop's IPVS backend owns, in
// one transaction per table.
func (i *iptables) cleanup() error {
	tables, err := i.tablesNow()
	if err != nil {
		return err
	}
	bt := batch{}
	for _, j := range jumps {
		if slices.ContainsFunc(tables[j.table][j.from], func(r []string) bool { return slices.Equal(r, jumpSpec(j.to)) }) {
			bt.add(j.table, append([]string{"-D", j.from}, jumpSpec(j.to)...)...)
		}
	}
	for _, table := range []string{"nat", "filter"} {
		// Flush all first: chains may jump to each other.
		var ours []string
		for c := range tables[table] {
			if strings.HasPrefix(c, "ONEHOP-IPVS-") || strings.HasPrefix(c, srChainPrefix) {
				ours = append(ours, c)
			}
		}
		slices.Sort(ours)
		for _, c := range ours {
			bt.add(table, "-F", c)
		}
		for _, c := range ours {
			bt.add(table, "-X", c)
		}
	}
	_, err = i.commit(bt)
	return err
}

// splitRule splits an `iptables -S` line into words, honouring the double
// quotes iptables puts around comments.
func splitRule(s string) []string {
	var out []string
	var cur strings.Builder
	inQ, have := false, false
	for idx := 0; idx < len(s); idx++ {
		c := s[idx]
		switch {
		case c == '\\' && inQ && idx+1 < len(s):
			idx++
			cur.WriteByte(s[idx])
		case c == '"':
			inQ, have = !inQ, true
		case (c == ' ' || c == '\t') && !inQ:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}
