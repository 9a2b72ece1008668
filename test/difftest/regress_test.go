package difftest

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// replayRegressions runs each case of regressionDir through both twins,
// one subtest per case, and fails on every difference neither deliberate
// nor known (allowed.go): a difference once fixed stays fixed.
func (r *runner) replayRegressions(ctx context.Context, t *testing.T) {
	regs, err := loadRegressions(regressionDir)
	if err != nil {
		t.Fatalf("regression cases: %v", err)
	}
	for _, reg := range regs {
		t.Run("regression/"+reg.Name, func(t *testing.T) {
			diffs, err := r.run(ctx, reg.Case)
			if err != nil {
				t.Fatalf("%v\n%s", err, reg.Case.YAML())
			}
			if f := failing(diffs); len(f) > 0 {
				var b strings.Builder
				b.WriteString(reg.Case.YAML())
				b.WriteString("# probes that differ:\n")
				for _, d := range f {
					b.WriteString(r.describe(d))
				}
				fmt.Fprintf(&b, "# replay: %s=0 go test -run 'TestDifferential/regression/%s' ./test/difftest/\n", EnvCases, reg.Name)
				t.Errorf("%s/%s.yaml: kube-proxy and onehop differ again\n%s", regressionDir, reg.Name, b.String())
			}
		})
	}
}

// A case printed as YAML reads back as the same case, so that a failing
// case's report, saved under regressionDir, replays what failed; and every
// saved case reads.
func TestCaseYAMLReadsBack(t *testing.T) {
	for seed := range uint64(500) {
		c := generate(seed)
		for _, s := range c.Services {
			// The draws leave some features out; these make sure the
			// split and duplicate slices and the status are read too.
			if len(s.Endpoints) > 1 && s.Split == 0 && seed%3 == 0 {
				s.Split, s.Duplicate = 1, seed%2 == 0
			}
		}
		want := c.YAML()
		back, err := parseCase(want)
		if err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, want)
		}
		if got := back.YAML(); got != want {
			t.Fatalf("seed %d reads back as another case:\n%s\n---- printed, then read as ----\n%s", seed, want, got)
		}
	}
	regs, err := loadRegressions(regressionDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(regs) == 0 {
		t.Fatalf("no regression case in %s", regressionDir)
	}
	for _, reg := range regs {
		if len(reg.Case.Services) == 0 || reg.Case.Seed == 0 {
			t.Errorf("%s: no Service or no seed", reg.Name)
		}
	}
}

// Input that is not a case is an error, not a case of less.
func TestParseCaseRejects(t *testing.T) {
	svc := "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-0\nspec:\n  ipFamilies: [IPv4]\n"
	slice := "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: svc-0-ipv4\n"
	for name, text := range map[string]string{
		"empty":          "# case seed 1\n",
		"unknown field":  "---\n" + svc + "  clusterIPz: 10.96.0.1\n---\n" + slice,
		"no slice":       "---\n" + svc,
		"another kind":   "---\n" + svc + "---\napiVersion: v1\nkind: Pod\n",
		"not a plan pod": "---\n" + svc + "---\n" + slice + "endpoints:\n- addresses: [10.0.0.1]\n  targetRef: {kind: Pod, name: web-1}\n",
	} {
		if c, err := parseCase(text); err == nil {
			t.Errorf("%s: read as %+v, want an error", name, c)
		}
	}
}
