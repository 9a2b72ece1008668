package difftest

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/nsutil"
)

// TestMatrix holds kube-proxy and onehop to the service matrix: every
// behaviour (matrix.go) through every way in, over TCP and UDP, in IPv4
// and IPv6, from every vantage point, each probe against the outcome the
// oracle (matrix_oracle.go) demands. A cell where onehop differs fails the
// test unless it is on a list with its reason; a cell where kube-proxy
// itself differs fails too: the oracle is then suspect. The matrix is
// printed as a table (docs/service-matrix.md holds the last one).
func TestMatrix(t *testing.T) {
	nsutil.RequireRoot(t)
	testMatrix(t, startTwins)
}

// EnvMatrixProbes, set, logs every probe of the matrix with the oracle's
// outcome and each twin's.
const EnvMatrixProbes = "ONEHOP_MATRIX_PROBES"

// twinStarter builds a pair of twins under dir.
type twinStarter func(ctx context.Context, dir string, log *slog.Logger) (*runner, error)

// testMatrix runs the matrix on the twins start builds, in both families.
func testMatrix(t *testing.T, start twinStarter) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	began := time.Now()
	r := twinsFor(ctx, t, start)
	families := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	var results []cellResult
	for _, f := range families {
		results = append(results, r.runMatrix(ctx, t, f)...)
	}
	counts := map[cellStatus]int{}
	for _, res := range results {
		counts[res.Status]++
		if os.Getenv(EnvMatrixProbes) != "" {
			t.Logf("%s: %s", res.Status, res)
		}
		switch res.Status {
		case cellKnown:
			t.Logf("known: %s\n    %s: %s", res, res.Known.Name, res.Known.Reason)
		case cellDiffers:
			t.Errorf("onehop differs from kube-proxy and the oracle: %s", res)
		case cellOracle:
			t.Errorf("kube-proxy differs from the oracle (is the oracle wrong?): %s", res)
		}
	}
	t.Logf("matrix: %d probes in %v: %d ok, %d known, %d onehop differs, %d kube-proxy differs from the oracle\n%s",
		len(results), time.Since(began).Round(time.Second), counts[cellOK], counts[cellKnown], counts[cellDiffers], counts[cellOracle],
		matrixTable(results, families))
}

// twinsFor builds the twins for t: torn down when t ends, each proxy's
// log tail printed if t failed.
func twinsFor(ctx context.Context, t *testing.T, start twinStarter) *runner {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	began := time.Now()
	r, err := start(ctx, t.TempDir(), log)
	if err != nil {
		t.Fatalf("twins: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			r.logState(t)
		}
		r.Close()
	})
	t.Logf("twins up in %v", time.Since(began).Round(time.Millisecond))
	return r
}

// runMatrix writes the matrix's Services of family f to both twins, waits
// for both proxies, probes every cell on both and removes the Services.
func (r *runner) runMatrix(ctx context.Context, t *testing.T, f v1.IPFamily) []cellResult {
	t.Helper()
	c := matrixCase(f)
	began := time.Now()
	defer func() {
		if err := r.both(func(_ int, tw *Twin) error { return tw.remove(context.WithoutCancel(ctx), c) }); err != nil {
			t.Errorf("remove the %s matrix: %v", f, err)
		}
	}()
	if err := r.both(func(_ int, tw *Twin) error {
		if err := tw.apply(ctx, c); err != nil {
			return err
		}
		if err := tw.labelSlices(ctx, c, f); err != nil {
			return err
		}
		return tw.sync(ctx)
	}); err != nil {
		t.Fatalf("%s matrix: %v\n%s", f, err, c.YAML())
	}
	cells := matrixCells(c, behaviours(), f)
	var got [2][]outcome
	_ = r.both(func(i int, tw *Twin) error {
		got[i] = tw.observeAll(ctx, cells)
		return nil
	})
	for _, tw := range r.twins {
		if msg := tw.exited(); msg != "" {
			t.Fatalf("%s", msg)
		}
	}
	t.Logf("%s matrix: %d Services, %d probes per twin in %v", f, len(c.Services), len(cells), time.Since(began).Round(time.Millisecond))
	return judge(c, cells, got)
}
