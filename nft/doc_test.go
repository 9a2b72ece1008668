package nft

import (
	"go/parser"
	"go/token"
	"regexp"
	"strings"
	"testing"
)

// docNames returns the chain and set names the package comment's ruleset
// names, as patterns: <f> is 4 or 6, another <...> or "..." anything.
func docNames(t *testing.T) (chains, sets []string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("doc.go has no package comment: %v", err)
	}
	chainRef := regexp.MustCompile(`\b(?:chain|jump|goto) ([^\s,;(){}]+)`)
	setRef := regexp.MustCompile(`(?:^|[\s({])@([^\s,;(){}]+)`)
	for _, line := range strings.Split(f.Doc.Text(), "\n") {
		if !strings.HasPrefix(line, "\t") {
			continue // prose; only the ruleset's lines are read
		}
		for _, m := range chainRef.FindAllStringSubmatch(line, -1) {
			chains = append(chains, strings.TrimSuffix(m[1], ":"))
		}
		for _, m := range setRef.FindAllStringSubmatch(line, -1) {
			sets = append(sets, strings.TrimSuffix(m[1], ":"))
		}
	}
	if len(chains) < 10 || len(sets) < 10 {
		t.Fatalf("read only chains %q and sets %q from doc.go's ruleset", chains, sets)
	}
	return chains, sets
}

var (
	placeholder = regexp.MustCompile(`<[^>]+>|\\\.\\\.\\\.`)
	familyMark  = regexp.QuoteMeta("<f>")
)

func namePattern(name string) *regexp.Regexp {
	q := strings.ReplaceAll(regexp.QuoteMeta(name), familyMark, "[46]")
	return regexp.MustCompile("^" + placeholder.ReplaceAllString(q, ".+") + "$")
}

// TestDocNamesTheRuleset keeps doc.go true: every chain, set and map it
// names is in a table holding every kind of object the backend creates,
// with its IPv6 twin, and every one in the table is named there.
func TestDocNamesTheRuleset(t *testing.T) {
	t.Parallel()
	docChains, docSets := docNames(t)
	tp := newTopo(t, 0)
	tp.sync(t, policiesSnapshot(), true)
	k := readTable(t, tp)
	var sets []string
	for _, s := range k.sets {
		if !s.anonymous() {
			sets = append(sets, s.name)
		}
	}
	check := func(kind string, documented, actual []string) {
		t.Helper()
		have := map[string]bool{}
		for _, a := range actual {
			have[a] = true
		}
		for _, d := range documented {
			p := namePattern(d)
			found := false
			for _, a := range actual {
				found = found || p.MatchString(a)
			}
			if !found {
				t.Errorf("doc.go names %s %q, which the ruleset does not have", kind, d)
			}
			if base, ok := strings.CutSuffix(d, "4"); ok && !strings.Contains(d, "<") && !have[base+"6"] {
				t.Errorf("doc.go says %s %q has an IPv6 twin %q; the ruleset has none", kind, d, base+"6")
			}
		}
		// The IPv6 half is described by the IPv4 one.
		withTwins := documented
		for _, d := range documented {
			if base, ok := strings.CutSuffix(d, "4"); ok && !strings.Contains(d, "<") {
				withTwins = append(withTwins, base+"6")
			}
		}
		for _, a := range actual {
			found := false
			for _, d := range withTwins {
				found = found || namePattern(d).MatchString(a)
			}
			if !found {
				t.Errorf("the ruleset has %s %q, which doc.go does not describe", kind, a)
			}
		}
	}
	check("chain", docChains, k.chains)
	check("set", docSets, sets)
}
