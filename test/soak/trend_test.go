package soak

import (
	"math/rand/v2"
	"testing"
	"time"
)

// series returns n samples taken every gap, each level(t) plus gaussian
// noise of sd noise.
func series(r *rand.Rand, n int, gap time.Duration, noise float64, level func(t time.Duration) float64) ([]time.Duration, []float64) {
	at := make([]time.Duration, n)
	ys := make([]float64, n)
	for i := range n {
		at[i] = time.Duration(i+1) * gap
		ys[i] = level(at[i]) + r.NormFloat64()*noise
	}
	return at, ys
}

func flat(v float64) func(time.Duration) float64 { return func(time.Duration) float64 { return v } }

// leaking grows by frac of base across the second half of a run of length
// run (and as fast in the first).
func leaking(base, frac float64, run time.Duration) func(time.Duration) float64 {
	return func(t time.Duration) float64 { return base + base*frac*(t.Seconds()/(run.Seconds()/2)) }
}

// verdicts counts, over seeds, the series the rule calls leaking.
func verdicts(seeds, n int, gap time.Duration, noise float64, level func(time.Duration) float64, b Bound) int {
	leaks := 0
	for s := range seeds {
		r := rand.New(rand.NewPCG(uint64(s), 1))
		at, ys := series(r, n, gap, noise, level)
		if FitAfterWarmup(at, ys, b).Leaks() {
			leaks++
		}
	}
	return leaks
}

// A healthy measure, flat with noise of 2% of its level, passes; one that
// grows steadily (a leak) fails. Over 1000 noise draws each, at most 1%
// false alarms, and at least 99% of leaks found: leaks of 15% of the level
// across the fitted half in the CI run's 20 samples, of 10% in `make
// soak`'s 60.
func TestLeakRuleOnSyntheticSeries(t *testing.T) {
	b := Bound{Rel: 0.05, Abs: 1}
	for _, run := range []struct {
		samples int
		gap     time.Duration
		leak    float64
	}{{20, 15 * time.Second, 0.15}, {60, time.Minute, 0.10}} {
		total := time.Duration(run.samples) * run.gap
		const seeds = 1000
		if fp := verdicts(seeds, run.samples, run.gap, 2, flat(100), b); fp > seeds/100 {
			t.Errorf("%d samples: %d of %d flat noisy series called leaking", run.samples, fp, seeds)
		} else {
			t.Logf("%d samples: flat series with 2%% noise: %d of %d called leaking", run.samples, fp, seeds)
		}
		if found := verdicts(seeds, run.samples, run.gap, 2, leaking(100, run.leak, total), b); found < seeds*99/100 {
			t.Errorf("%d samples: only %d of %d series growing %.0f%% across the fitted half found", run.samples, found, seeds, run.leak*100)
		} else {
			t.Logf("%d samples: series growing %.0f%% across the fitted half: %d of %d found", run.samples, run.leak*100, found, seeds)
		}
	}
}

// Shapes a healthy agent shows pass; a slow steady leak of goroutines or
// of memory fails.
func TestLeakRuleShapes(t *testing.T) {
	const n, gap = 60, time.Minute
	r := rand.New(rand.NewPCG(7, 7))
	cases := []struct {
		name  string
		b     Bound
		level func(i int) float64
		leaks bool
	}{
		{"a heap that saws between 30 and 48 MiB as the GC runs", Bound{0.05, 1 << 20},
			func(int) float64 { return (30 + 18*r.Float64()) * (1 << 20) }, false},
		{"RSS that climbs during warm-up, then holds", Bound{0.05, 1 << 20},
			func(i int) float64 { return float64(min(i, n/3)) * (1 << 20) }, false},
		{"goroutines flat at 57, sometimes a few more in flight", Bound{0.05, 5},
			func(int) float64 { return 57 + float64(r.IntN(4)/3*r.IntN(4)) }, false},
		{"descriptors that never move", Bound{0.05, 5},
			func(int) float64 { return 23 }, false},
		{"one goroutine more every minute", Bound{0.05, 5},
			func(i int) float64 { return 57 + float64(i) }, true},
		{"RSS leaking 100 KiB a minute under 0.3 MiB noise", Bound{0.05, 1 << 20},
			func(i int) float64 { return 40<<20 + float64(i)*100*1024 + r.NormFloat64()*0.3*(1<<20) }, true},
		{"a heap that saws by 18 MiB and leaks 1 MiB a minute", Bound{0.05, 1 << 20},
			func(i int) float64 { return (30 + 18*r.Float64() + float64(i)) * (1 << 20) }, true},
	}
	for _, c := range cases {
		at := make([]time.Duration, n)
		ys := make([]float64, n)
		for i := range n {
			at[i], ys[i] = time.Duration(i+1)*gap, c.level(i)
		}
		tr := FitAfterWarmup(at, ys, c.b)
		if tr.Leaks() != c.leaks {
			t.Errorf("%s: leaks=%v, want %v: %v", c.name, tr.Leaks(), c.leaks, tr)
		} else {
			t.Logf("%s: %v", c.name, tr)
		}
	}
}

func TestLeakRuleNeedsSamples(t *testing.T) {
	at := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second}
	ys := []float64{1, 10, 100, 1000, 10000}
	if tr := FitAfterWarmup(at, ys, Bound{}); tr.Leaks() || tr.N != 3 {
		t.Errorf("3 samples after warm-up: %+v, want no verdict", tr)
	}
	if tr := FitAfterWarmup(nil, nil, Bound{}); tr.Leaks() {
		t.Error("no samples: leaks")
	}
}
