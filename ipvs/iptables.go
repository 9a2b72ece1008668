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
// chains it owns (ONEHOP-IPVS-*, ONEHOP-SR-*) and one jump rule in each of
// nat POSTROUTING and filter INPUT.
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
	{"nat", chainMasqExt}, {"nat", chainKeepSource}, {"nat", chainHairpin}, {"filter", chainInput},
}

var jumps = []struct{ table, from, to string }{
	{"nat", "POSTROUTING", chainPostrouting},
	{"filter", "INPUT", chainInput},
}

func jumpSpec(to string) []string {
	return []string{"-m", "comment", "--comment", jumpComment, "-j", to}
}

func (i *iptables) ensureChain(table, chain string) error {
	ok, err := i.t.ChainExists(table, chain)
	if err != nil {
		return fmt.Errorf("ipvs: iptables -t %s -S: %w", table, err)
	}
	if !ok {
		if err := i.t.NewChain(table, chain); err != nil {
			return fmt.Errorf("ipvs: creating %s/%s: %w", table, chain, err)
		}
	}
	return nil
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

// ensureBase creates onehop's chains, writes the fixed postrouting chain
// when it differs, and adds the jumps from the built-in chains.
func (i *iptables) ensureBase(cfg dataplane.Config, fam portal.Family) error {
	tables := map[string]tableRules{}
	for _, table := range []string{"nat", "filter"} {
		tr, err := i.snapshot(table)
		if err != nil {
			return err
		}
		tables[table] = tr
	}
	for _, c := range append([]struct{ table, chain string }{{"nat", chainPostrouting}}, entryChains...) {
		if _, ok := tables[c.table][c.chain]; ok {
			continue
		}
		if err := i.t.NewChain(c.table, c.chain); err != nil {
			return fmt.Errorf("ipvs: creating %s/%s: %w", c.table, c.chain, err)
		}
	}
	want := postroutingRules(cfg, fam, i.randomFully)
	have := tables["nat"][chainPostrouting]
	if !slices.EqualFunc(have, want, slices.Equal) {
		// A fixed chain of a dozen rules that changes only with the
		// configuration: rewrite it in place, rule by rule.
		for n, r := range want {
			if n < len(have) {
				if !slices.Equal(have[n], r) {
					if err := i.t.Replace("nat", chainPostrouting, n+1, r...); err != nil {
						return fmt.Errorf("ipvs: %s: %w", chainPostrouting, err)
					}
				}
				continue
			}
			if err := i.t.Append("nat", chainPostrouting, r...); err != nil {
				return fmt.Errorf("ipvs: %s: %w", chainPostrouting, err)
			}
		}
		for n := len(have); n > len(want); n-- {
			if err := i.t.DeleteById("nat", chainPostrouting, n); err != nil {
				return fmt.Errorf("ipvs: %s: %w", chainPostrouting, err)
			}
		}
	}
	for _, j := range jumps {
		if slices.ContainsFunc(tables[j.table][j.from], func(r []string) bool { return slices.Equal(r, jumpSpec(j.to)) }) {
			continue
		}
		if err := i.t.Insert(j.table, j.from, 1, jumpSpec(j.to)...); err != nil {
			return fmt.Errorf("ipvs: jump %s/%s -> %s: %w", j.table, j.from, j.to, err)
		}
	}
	return nil
}

// checkBase reports a missing jump or chain (iptables -C fails when the
// target chain is gone, too).
func (i *iptables) checkBase(fam portal.Family) error {
	for _, j := range jumps {
		ok, err := i.t.Exists(j.table, j.from, jumpSpec(j.to)...)
		if err != nil || !ok {
			return fmt.Errorf("ipvs: %s jump %s/%s -> %s is gone (%v)", fam, j.table, j.from, j.to, err)
		}
	}
	return nil
}

// list returns the rules of a chain as rule specs, without the -N/-A.
func (i *iptables) list(table, chain string) ([][]string, error) {
	lines, err := i.t.List(table, chain)
	if err != nil {
		return nil, fmt.Errorf("ipvs: listing %s/%s: %w", table, chain, err)
	}
	var out [][]string
	for _, l := range lines {
		f := splitRule(l)
		if len(f) >= 2 && f[0] == "-A" && f[1] == chain {
			out = append(out, f[2:])
		}
	}
	return out, nil
}

// readRules adds the kernel's per-entry rules and SR chains to pl.
func (i *iptables) readRules(fam portal.Family, pl *plan) error {
	tables := map[string]tableRules{}
	for _, table := range []string{"nat", "filter"} {
		tr, err := i.snapshot(table)
		if err != nil {
			return err
		}
		tables[table] = tr
	}
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
	return nil
}

// applyRules sends the rule differences of every family. New SR chains are
// filled before anything jumps to them; stale ones are deleted after their
// jumps are gone.
func (b *Backend) applyRules(have, want *plan, full bool) (int, error) {
	msgs := 0
	for fam, i := range b.ipt {
		for name, c := range want.SRChains {
			if c.Family != fam {
				continue
			}
			old, ok := have.SRChains[name]
			if ok && slices.EqualFunc(old.Rules, c.Rules, slices.Equal) {
				continue
			}
			msgs++
			if ok {
				if err := i.t.ClearChain("filter", name); err != nil {
					return msgs, err
				}
			} else if err := i.ensureChain("filter", name); err != nil {
				return msgs, err
			}
			for _, r := range c.Rules {
				msgs++
				if err := i.t.Append("filter", name, r...); err != nil {
					return msgs, fmt.Errorf("ipvs: %s: %w", name, err)
				}
			}
		}
		for k, r := range want.Rules {
			if r.Family != fam {
				continue
			}
			if _, ok := have.Rules[k]; ok {
				continue
			}
			msgs++
			if err := i.t.Append(r.Table, r.Chain, r.Spec...); err != nil {
				return msgs, fmt.Errorf("ipvs: %s -A %s %s: %w", r.Table, r.Chain, strings.Join(r.Spec, " "), err)
			}
		}
		for k, r := range have.Rules {
			if r.Family != fam {
				continue
			}
			if _, ok := want.Rules[k]; ok {
				continue
			}
			msgs++
			if err := i.t.DeleteIfExists(r.Table, r.Chain, r.Spec...); err != nil {
				return msgs, fmt.Errorf("ipvs: %s -D %s %s: %w", r.Table, r.Chain, strings.Join(r.Spec, " "), err)
			}
		}
		for name, c := range have.SRChains {
			if c.Family != fam {
				continue
			}
			if _, ok := want.SRChains[name]; ok {
				continue
			}
			msgs++
			if err := i.t.ClearAndDeleteChain("filter", name); err != nil {
				return msgs, fmt.Errorf("ipvs: deleting %s: %w", name, err)
			}
		}
	}
	return msgs, nil
}

// cleanup removes the jumps and every chain onehop's IPVS backend owns.
func (i *iptables) cleanup() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, j := range jumps {
		keep(i.t.DeleteIfExists(j.table, j.from, jumpSpec(j.to)...))
	}
	for _, table := range []string{"nat", "filter"} {
		chains, err := i.t.ListChains(table)
		if err != nil {
			keep(err)
			continue
		}
		// Flush all first: chains may jump to each other.
		var ours []string
		for _, c := range chains {
			if strings.HasPrefix(c, "ONEHOP-IPVS-") || strings.HasPrefix(c, srChainPrefix) {
				ours = append(ours, c)
				keep(i.t.ClearChain(table, c))
			}
		}
		for _, c := range ours {
			keep(i.t.DeleteChain(table, c))
		}
	}
	return first
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
