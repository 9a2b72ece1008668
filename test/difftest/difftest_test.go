package difftest

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// Environment variables of a longer or replayed run (make difftest).
const (
	// EnvCases is how many cases to run (default defaultCases; 0: the
	// regression cases only).
	EnvCases = "ONEHOP_DIFFTEST_CASES"
	// EnvSeed is the first case's seed; case i has seed+i. Default: a fixed
	// seed for the default number of cases, a random (printed) one when
	// EnvCases asks for more.
	EnvSeed = "ONEHOP_DIFFTEST_SEED"
)

// The fixed run `go test` (and so `make test`) makes: seeds 1 to
// defaultCases.
const (
	defaultCases = 30
	defaultSeed  = 1
)

// TestDifferential gives kube-proxy and onehop the regression cases
// (testdata/regressions, regress.go), then the same random cases, and
// fails on every difference in what the probes see that is neither
// deliberate nor known (allowed.go). A failing case is shrunk and printed
// as YAML with the probes that differ.
func TestDifferential(t *testing.T) {
	nsutil.RequireRoot(t)
	seed, cases := runSize(t)
	t.Logf("difftest: %d cases from seed %d (replay one: %s=S %s=1)", cases, seed, EnvSeed, EnvCases)

	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	began := time.Now()
	r, err := startTwins(ctx, t.TempDir(), log)
	if err != nil {
		t.Fatalf("twins: %v", err)
	}
	defer r.Close()
	t.Cleanup(func() {
		if t.Failed() {
			r.logState(t)
		}
	})
	t.Logf("twins up in %v", time.Since(began).Round(time.Millisecond))
	r.replayRegressions(ctx, t)

	ran, changed, allowedSeen := 0, 0, map[string]int{}
	compareStart := time.Now()
	for i := range cases {
		c := generate(seed + uint64(i))
		steps := changes(c.Seed, c)
		diffs, at, err := r.runSteps(ctx, c, steps)
		if err != nil {
			t.Fatalf("case seed %d: %v\n%s", c.Seed, err, c.YAML())
		}
		ran++
		changed += at
		for _, d := range diffs {
			if d.Allowed != nil {
				allowedSeen[d.Allowed.Name]++
			}
		}
		if len(failing(diffs)) == 0 {
			continue
		}
		small, smallSteps, smallDiffs, err := r.shrinkSteps(ctx, c, steps[:at], diffs)
		if err != nil {
			t.Logf("shrinking case seed %d: %v", c.Seed, err)
		}
		if len(smallSteps) > 0 {
			t.Errorf("case seed %d: kube-proxy and onehop differ after its changes\n%s", c.Seed, r.reportSteps(small, smallSteps, smallDiffs))
			continue
		}
		t.Errorf("case seed %d: kube-proxy and onehop differ\n%s", c.Seed, r.report(small, smallDiffs))
	}
	took := time.Since(compareStart)
	t.Logf("difftest: %d cases (%d changes) from seed %d in %v (%.1f cases/minute; twins up in %v); allowed differences seen: %v",
		ran, changed, seed, took.Round(time.Second), float64(ran)/took.Minutes(), compareStart.Sub(began).Round(time.Second), allowedSeen)
}

// runSize reads EnvSeed and EnvCases.
func runSize(t *testing.T) (seed uint64, cases int) {
	seed, cases = defaultSeed, defaultCases
	if s := os.Getenv(EnvCases); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			t.Fatalf("%s=%q: want a number, 0 for the regression cases only", EnvCases, s)
		}
		cases = n
		seed = rand.Uint64N(1 << 32)
	}
	if s := os.Getenv(EnvSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a number", EnvSeed, s)
		}
		seed = n
	}
	return seed, cases
}

// report prints a failing case: its objects and the probes that differ.
func (r *runner) report(c *Case, diffs []difference) string {
	var b strings.Builder
	b.WriteString(c.YAML())
	b.WriteString("# probes that differ:\n")
	for _, d := range diffs {
		b.WriteString(r.describe(d))
	}
	fmt.Fprintf(&b, "# replay: %s=%d %s=1 go test ./test/difftest/\n", EnvSeed, c.Seed, EnvCases)
	return b.String()
}

// reportSteps prints a case that differs after changes: its first state,
// each change and the state after it, and the probes that differ.
func (r *runner) reportSteps(c *Case, steps []step, diffs []difference) string {
	var b strings.Builder
	b.WriteString(c.YAML())
	for i, st := range steps {
		fmt.Fprintf(&b, "# change %d: %s; then:\n%s", i+1, st.What, st.Next.YAML())
	}
	b.WriteString("# probes that differ after the last change:\n")
	for _, d := range diffs {
		b.WriteString(r.describe(d))
	}
	fmt.Fprintf(&b, "# replay: %s=%d %s=1 go test ./test/difftest/\n", EnvSeed, c.Seed, EnvCases)
	return b.String()
}

// logState logs what helps read a failure: each proxy's log tail.
func (r *runner) logState(t *testing.T) {
	for _, tw := range r.twins {
		for _, n := range tw.Nodes {
			if n.Proxy != nil {
				t.Logf("=== %s on %s (log tail):\n%s", tw.Name, n.Name, n.Proxy.Tail(3000))
			}
		}
	}
}
