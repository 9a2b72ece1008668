package dataplane

import "time"

// Syncs are paced by their cost, a budget of CPU time: the budget fills at
// PaceShare of the time that passes, up to PaceBurst, and each sync that
// changed the kernel spends its CPU time (the kernel's work on its
// messages included, not the time it waited for a CPU). A sync starts at
// once while the budget is not spent; after that it waits until the
// budget is back to zero, at most MaxPace. So a lone change, or a few in
// a row, are applied at once; a storm of changes takes about PaceShare of
// a CPU, each sync batching what arrived meanwhile, whatever the number of
// Services. A sync that changed nothing (a periodic one, or one whose
// changes cancelled out) costs nothing. A MinSyncPeriod, when set, is kept
// between syncs that changed the kernel as well (kube-proxy's meaning).
const (
	PaceShare = 0.02
	PaceBurst = 200 * time.Millisecond
	MaxPace   = time.Second
)

// pacer keeps the budget; only the sync goroutine uses it.
type pacer struct {
	minPeriod time.Duration
	budget    time.Duration // may go below zero
	at        time.Time     // when budget was last brought up to date
	lastSpent time.Time     // the end of the last sync that changed the kernel
}

func newPacer(minPeriod time.Duration, now time.Time) *pacer {
	return &pacer{minPeriod: minPeriod, budget: PaceBurst, at: now}
}

func (p *pacer) refill(now time.Time) {
	if d := now.Sub(p.at); d > 0 {
		p.budget = min(PaceBurst, p.budget+time.Duration(float64(d)*PaceShare))
		p.at = now
	}
}

// wait is how long the next sync waits from now.
func (p *pacer) wait(now time.Time) time.Duration {
	p.refill(now)
	var w time.Duration
	if p.budget < 0 {
		w = min(time.Duration(float64(-p.budget)/PaceShare), MaxPace)
	}
	if !p.lastSpent.IsZero() {
		w = max(w, p.minPeriod-now.Sub(p.lastSpent))
	}
	return max(w, 0)
}

// spent records a sync that changed the kernel and cost cpu, ending now.
func (p *pacer) spent(now time.Time, cpu time.Duration) {
	p.refill(now)
	// A sync may cost more than MaxPace can pay back: the debt is bounded
	// so that one huge sync does not hold the next ones for long.
	p.budget = max(p.budget-cpu, -time.Duration(float64(MaxPace)*PaceShare))
	p.lastSpent = now
}
