package soak

import (
	"fmt"
	"math"
	"time"
)

// The leak rule. A measure that leaks grows for as long as the agent runs;
// one that is healthy wanders around a level once the agent has warmed up.
// The rule fits a least-squares line through the samples of the second
// half of the run (the first half is warm-up: caches fill, the Go runtime
// finds its heap goal) and calls the measure leaking when the growth the
// line shows across those samples,
//
//	growth = slope * (t_last - t_first),
//
// exceeds the largest of
//
//   - 3 times the standard deviation of the samples around the line (the
//     measure's own noise: a garbage-collected heap saws up and down, and a
//     line through few noisy samples tilts by chance);
//   - Rel of the samples' mean (5%: a slow drift that small is not worth a
//     failure, and RSS moves that much as the runtime returns pages);
//   - Abs, a floor in the measure's unit (a few goroutines or descriptors
//     come and go with one scrape or one watch reconnecting).
//
// The growth is measured across the fitted samples, not extrapolated to
// the whole run: the line is only known there, and stretching it doubles
// its chance tilt. Fewer than MinFit samples give no verdict. Only this
// relative bound decides; no absolute time or size does.

// MinFit is the fewest samples the rule fits a line through.
const MinFit = 4

// Bound is how much a measure may grow across the fitted window.
type Bound struct {
	Rel float64 // of the fitted samples' mean
	Abs float64 // in the measure's unit
}

// Trend is the line through a measure's samples after warm-up.
type Trend struct {
	N          int     // samples fitted
	Slope      float64 // per second
	Span       float64 // seconds from the first fitted sample to the last
	Growth     float64 // Slope * Span
	Mean       float64
	ResidualSD float64 // of the samples around the line
	Limit      float64 // max(3*ResidualSD, Rel*Mean, Abs)
}

// Leaks reports whether the growth exceeds the limit.
func (tr Trend) Leaks() bool { return tr.N >= MinFit && tr.Growth > tr.Limit }

func (tr Trend) String() string {
	if tr.N < MinFit {
		return fmt.Sprintf("%d samples after warm-up, too few to fit", tr.N)
	}
	return fmt.Sprintf("growth %.3g over %v of %d samples (mean %.3g, noise sd %.3g), limit %.3g",
		tr.Growth, (time.Duration(tr.Span) * time.Second).Round(time.Second), tr.N, tr.Mean, tr.ResidualSD, tr.Limit)
}

// FitAfterWarmup fits the samples taken in the second half of the run: at
// or after half of the last sample's time.
func FitAfterWarmup(at []time.Duration, ys []float64, b Bound) Trend {
	if len(at) == 0 {
		return Trend{}
	}
	half := at[len(at)-1] / 2
	var xs, fit []float64
	for i, t := range at {
		if t >= half {
			xs = append(xs, t.Seconds())
			fit = append(fit, ys[i])
		}
	}
	return Fit(xs, fit, b)
}

// Fit fits ys at xs (seconds) and applies b.
func Fit(xs, ys []float64, b Bound) Trend {
	n := len(xs)
	tr := Trend{N: n}
	if n == 0 {
		return tr
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(n)
	my /= float64(n)
	tr.Mean = my
	var sxx, sxy float64
	for i := range xs {
		sxx += (xs[i] - mx) * (xs[i] - mx)
		sxy += (xs[i] - mx) * (ys[i] - my)
	}
	if sxx > 0 {
		tr.Slope = sxy / sxx
	}
	tr.Span = xs[n-1] - xs[0]
	tr.Growth = tr.Slope * tr.Span
	if n > 2 {
		var ss float64
		for i := range xs {
			r := ys[i] - (my + tr.Slope*(xs[i]-mx))
			ss += r * r
		}
		tr.ResidualSD = math.Sqrt(ss / float64(n-2))
	}
	tr.Limit = max(3*tr.ResidualSD, b.Rel*math.Abs(tr.Mean), b.Abs)
	return tr
}
