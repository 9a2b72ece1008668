package soak

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// Run is one soak's record: its settings, samples and outcome.
type Run struct {
	Knobs
	Node     string // the agent sampled
	Load     [2]string
	Samples  []Sample
	Trends   []NamedTrend
	Churn    string // Churn.Summary
	Requests int64  // to the stable Services
	Failed   int64
	UDPFlows int // DNATed UDP entries checked at the end
	Stale    int // of which stale
	Diffs    int // differences from a fresh agent's table, both nodes
}

// NamedTrend is a measure's trend under the leak rule.
type NamedTrend struct {
	Name string
	Trend
}

// The measures the leak rule watches, and their bounds (memory in MiB).
var leakBounds = []struct {
	name  string
	get   func(Sample) float64
	bound Bound
}{
	{"RSS (MiB)", func(s Sample) float64 { return s.RSS / (1 << 20) }, Bound{Rel: 0.05, Abs: 1}},
	// The heap saws between GCs by up to its live size; a short run's few
	// samples after warm-up fit that saw loosely (a healthy 5-minute run
	// came within 6% of the 5% bound), so a short run holds the heap to a
	// quarter of its mean (shortHeapBound): about 2.5 MiB across the
	// fitted 2.5 minutes, which a leak of 200 bytes per change at 100
	// changes/s still exceeds.
	{"Go heap in use (MiB)", func(s Sample) float64 { return s.Heap / (1 << 20) }, Bound{Rel: 0.05, Abs: 1}},
	{"goroutines", func(s Sample) float64 { return s.Goroutines }, Bound{Rel: 0.05, Abs: 5}},
	{"open fds", func(s Sample) float64 { return float64(s.FDs) }, Bound{Rel: 0.05, Abs: 5}},
}

// A run shorter than shortRun (the 5-minute one in make test) judges the
// heap by shortHeapBound.
const shortRun = 15 * time.Minute

var shortHeapBound = Bound{Rel: 0.25, Abs: 2}

// FitTrends applies the leak rule to every watched measure.
func FitTrends(samples []Sample) []NamedTrend {
	at := make([]time.Duration, len(samples))
	for i, s := range samples {
		at[i] = s.At
	}
	var out []NamedTrend
	for _, m := range leakBounds {
		ys := make([]float64, len(samples))
		for i, s := range samples {
			ys[i] = m.get(s)
		}
		b := m.bound
		if m.name == "Go heap in use (MiB)" && len(at) > 0 && at[len(at)-1] < shortRun {
			b = shortHeapBound
		}
		out = append(out, NamedTrend{m.name, FitAfterWarmup(at, ys, b)})
	}
	return out
}

func mib(b float64) string { return fmt.Sprintf("%.1f", b/(1<<20)) }

// Table is the run in Markdown: settings, machine, samples, trends.
func (r *Run) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %v at %.0f changes/s, seed %d (%s)\n\n", r.Duration, r.Rate, r.Seed, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Machine: %d CPUs, load average %s at the start, %s at the end. Agent sampled: %s.\n\n",
		runtime.NumCPU(), r.Load[0], r.Load[1], r.Node)
	fmt.Fprintf(&b, "Churn: %s.\n\n", r.Churn)
	b.WriteString("| t | RSS MiB | heap MiB | goroutines | fds | nft elements | conntrack | Services | changes | load 1/5/15 |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range r.Samples {
		fmt.Fprintf(&b, "| %v | %s | %s | %.0f | %d | %d | %d | %d | %d | %s |\n", s.At.Round(time.Second), mib(s.RSS), mib(s.Heap),
			s.Goroutines, s.FDs, s.Elements, s.Conntrack, s.Services, s.Changes, s.Load)
	}
	b.WriteString("\n| measure (second half) | verdict |\n|---|---|\n")
	for _, tr := range r.Trends {
		verdict := "flat"
		switch {
		case tr.N < MinFit:
			verdict = "no verdict"
		case tr.Leaks():
			verdict = "LEAKS"
		}
		fmt.Fprintf(&b, "| %s | %s: %v |\n", tr.Name, verdict, tr.Trend)
	}
	fmt.Fprintf(&b, "\nRequests to the stable Services: %d, failed %d. At the end: %d DNATed UDP conntrack entries checked, %d stale; "+
		"%d differences between the tables and a fresh agent's.\n", r.Requests, r.Failed, r.UDPFlows, r.Stale, r.Diffs)
	return b.String()
}

// AppendTo adds the table to the file at path.
func (r *Run) AppendTo(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString("\n" + r.Table()); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
