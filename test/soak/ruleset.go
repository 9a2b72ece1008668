package soak

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/nft"
)

// Ruleset is what the kernel holds in onehop's table, read over netlink:
// each chain's rule count and each set's or map's elements, written as
// strings (key, interval end, data or verdict, comment; not the timeouts).
type Ruleset struct {
	Chains map[string]int
	Sets   map[string][]string
}

// Elements counts the elements of every set and map.
func (r *Ruleset) Elements() int {
	n := 0
	for _, els := range r.Sets {
		n += len(els)
	}
	return n
}

// kernel reads onehop's table in one network namespace.
type kernel struct {
	ns    *os.File
	conn  *nftables.Conn
	table *nftables.Table
}

func openKernel(netnsPath string) (*kernel, error) {
	f, err := os.Open(netnsPath)
	if err != nil {
		return nil, err
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, err
	}
	return &kernel{ns: f, conn: conn, table: &nftables.Table{Name: nft.TableName, Family: nftables.TableFamilyINet}}, nil
}

func (k *kernel) Close() error { return k.ns.Close() }

// dumpAttempts bounds the reads of one set: the kernel's dump of a hash set
// that rehashes meanwhile can hold an element twice (and miss another); such
// a dump is read again.
const dumpAttempts = 20

// Read returns the table's sets and, with rules, its chains. A set that
// goes away while the table is read (an affinity set of an endpoint just
// removed) is left out.
func (k *kernel) Read(rules bool) (*Ruleset, error) {
	sets, err := k.conn.GetSets(k.table)
	if err != nil {
		return nil, fmt.Errorf("sets of table inet %s: %w", nft.TableName, err)
	}
	r := &Ruleset{Sets: map[string][]string{}, Chains: map[string]int{}}
	for _, s := range sets {
		els, err := k.elements(s)
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		r.Sets[s.Name] = els
	}
	if !rules {
		return r, nil
	}
	chains, err := k.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	for _, c := range chains {
		if c.Table.Name != nft.TableName {
			continue
		}
		rs, err := k.conn.GetRules(k.table, c)
		if err != nil {
			return nil, fmt.Errorf("rules of chain %s: %w", c.Name, err)
		}
		r.Chains[c.Name] = len(rs)
	}
	return r, nil
}

// gone reports whether err says the object asked for is not there (the
// library keeps netlink's errno only in the message).
func gone(err error) bool {
	return err != nil && (errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "no such file or directory"))
}

func (k *kernel) elements(s *nftables.Set) ([]string, error) {
	for range dumpAttempts {
		els, err := k.conn.GetSetElements(s)
		if err != nil {
			return nil, err
		}
		out := make([]string, len(els))
		for i, e := range els {
			out[i] = elementString(e)
		}
		sort.Strings(out)
		if len(slices.Compact(slices.Clone(out))) == len(out) {
			return out, nil
		}
	}
	return nil, fmt.Errorf("every one of %d dumps held an element twice", dumpAttempts)
}

func elementString(e nftables.SetElement) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%x", e.Key)
	if len(e.KeyEnd) > 0 {
		fmt.Fprintf(&b, "-%x", e.KeyEnd)
	}
	if e.IntervalEnd {
		b.WriteString(" end")
	}
	if e.VerdictData != nil {
		fmt.Fprintf(&b, " : %s %s", verdictName(e.VerdictData.Kind), e.VerdictData.Chain)
	} else if len(e.Val) > 0 {
		fmt.Fprintf(&b, " : %x", e.Val)
	}
	if e.Comment != "" {
		fmt.Fprintf(&b, " comment %q", e.Comment)
	}
	return b.String()
}

func verdictName(k expr.VerdictKind) string {
	switch k {
	case expr.VerdictJump:
		return "jump"
	case expr.VerdictGoto:
		return "goto"
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	}
	return fmt.Sprintf("verdict(%d)", k)
}

// Which sets compare how. An endpoint map's key starts with the id of the
// chain that looks it up, and which of the maps (shards) holds a Service
// port's endpoints follows from that id: an agent that assigned its ids
// over an hour of changes and a fresh one agree on how many endpoint
// elements there are per family, not on their keys. An affinity set's
// elements are the clients that traffic made it remember. An anonymous
// set or map (a rule's literal set, named __set<n> or __map<n> by the
// kernel in the order made) compares as one pool of elements.
var (
	endpointShard = regexp.MustCompile(`^(endpoints[46])-[0-9]+$`)
	affinitySet   = regexp.MustCompile(`^aff[46]/`)
	anonymousSet  = regexp.MustCompile(`^__(set|map)[0-9]+$`)
)

// anonymous is the name the pool of anonymous sets' elements goes by.
const anonymous = "anonymous sets"

// pooled returns r's sets with the anonymous ones pooled under one name.
func pooled(r *Ruleset) map[string][]string {
	out := map[string][]string{}
	for name, els := range r.Sets {
		if anonymousSet.MatchString(name) {
			out[anonymous] = append(out[anonymous], els...)
			continue
		}
		out[name] = els
	}
	sort.Strings(out[anonymous])
	return out
}

// Diff lists how got differs from want: chains and their rule counts,
// sets by name, the elements of every set but the endpoint maps (their
// count per family) and the affinity sets (not compared), the anonymous
// sets' as one pool.
func Diff(got, want *Ruleset) []string {
	var out []string
	for _, name := range union(got.Chains, want.Chains) {
		g, inGot := got.Chains[name]
		w, inWant := want.Chains[name]
		switch {
		case !inGot:
			out = append(out, fmt.Sprintf("chain %s missing (%d rules)", name, w))
		case !inWant:
			out = append(out, fmt.Sprintf("chain %s extra (%d rules)", name, g))
		case g != w:
			out = append(out, fmt.Sprintf("chain %s: %d rules, want %d", name, g, w))
		}
	}
	gotEP, wantEP := map[string]int{}, map[string]int{}
	gotSets, wantSets := pooled(got), pooled(want)
	for _, name := range union(gotSets, wantSets) {
		g, inGot := gotSets[name]
		w, inWant := wantSets[name]
		if m := endpointShard.FindStringSubmatch(name); m != nil {
			gotEP[m[1]] += len(g)
			wantEP[m[1]] += len(w)
			continue
		}
		switch {
		case !inGot:
			out = append(out, fmt.Sprintf("set %s missing (%d elements)", name, len(w)))
			continue
		case !inWant:
			out = append(out, fmt.Sprintf("set %s extra (%d elements)", name, len(g)))
			continue
		case affinitySet.MatchString(name):
			continue
		}
		for _, e := range minus(g, w) {
			out = append(out, fmt.Sprintf("set %s: extra element %s", name, e))
		}
		for _, e := range minus(w, g) {
			out = append(out, fmt.Sprintf("set %s: missing element %s", name, e))
		}
	}
	for _, fam := range union(gotEP, wantEP) {
		if gotEP[fam] != wantEP[fam] {
			out = append(out, fmt.Sprintf("%s-*: %d elements, want %d", fam, gotEP[fam], wantEP[fam]))
		}
	}
	return out
}

func union[V any](a, b map[string]V) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// minus returns the elements of a (sorted) not in b (sorted), counting
// repeats.
func minus(a, b []string) []string {
	var out []string
	i, j := 0, 0
	for i < len(a) {
		switch {
		case j >= len(b) || a[i] < b[j]:
			out = append(out, a[i])
			i++
		case a[i] > b[j]:
			j++
		default:
			i++
			j++
		}
	}
	return out
}
