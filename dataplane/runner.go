package dataplane

import (
	"context"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// SnapshotSource produces desired state; portal.Tracker is one.
type SnapshotSource interface {
	// Snapshot returns the desired state and the trigger times of the
	// endpoint changes it contains.
	Snapshot() (*portal.Snapshot, []time.Time)
}

// RunnerConfig paces the Runner.
type RunnerConfig struct {
	// MinSyncPeriod is the least time between two syncs that changed the
	// kernel: changes arriving faster are batched into one. With 0 the
	// syncs are paced by their cost instead (see Pace).
	MinSyncPeriod time.Duration
	// SyncPeriod is the most time between two syncs (default 30s).
	SyncPeriod time.Duration
	// FullSyncPeriod is how often the whole ruleset is compared with the
	// kernel's and repaired even when nothing seems wrong (default 1h).
	FullSyncPeriod time.Duration
	// CheckPeriod is how often the kernel is checked for changes made by
	// someone else (default 1s).
	CheckPeriod time.Duration
	// MaxBackoff bounds the wait before retrying a failed sync (default 30s).
	MaxBackoff time.Duration
}

func (c *RunnerConfig) defaults() {
	if c.SyncPeriod <= 0 {
		c.SyncPeriod = 30 * time.Second
	}
	if c.FullSyncPeriod <= 0 {
		c.FullSyncPeriod = time.Hour
	}
	if c.CheckPeriod <= 0 {
		c.CheckPeriod = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
}

// Runner keeps a Dataplane in step with a SnapshotSource.
type Runner struct {
	dp      Dataplane
	src     SnapshotSource
	cfg     RunnerConfig
	log     *slog.Logger
	health  *HealthServer
	metrics *Metrics
	trigger chan struct{}

	mu        sync.Mutex
	onApplied []func(*portal.Snapshot)
	onPanic   []func(ServicePanic)
	onProblem []func(portal.Problem)
	onRepair  []func(KernelChange)

	// lastBusy is the end of the last sync that changed the kernel, in
	// Unix nanoseconds (LastBusy).
	lastBusy atomic.Int64

	// unapplied holds the Services changed in snapshots whose sync failed:
	// the next successful sync lists them in the Dirty its OnApplied
	// functions see. Only the sync goroutine uses it.
	unapplied map[portal.ServiceKey]struct{}
}

// NewRunner returns a Runner; health and metrics may be nil.
func NewRunner(dp Dataplane, src SnapshotSource, cfg RunnerConfig, log *slog.Logger, health *HealthServer, metrics *Metrics) *Runner {
	cfg.defaults()
	return &Runner{dp: dp, src: src, cfg: cfg, log: log, health: health, metrics: metrics, trigger: make(chan struct{}, 1)}
}

// LastBusy is when the last sync that changed the kernel ended (zero
// before the first).
func (r *Runner) LastBusy() time.Time {
	if n := r.lastBusy.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Trigger asks for a sync soon. It never blocks; use it as the Tracker's notify.
func (r *Runner) Trigger() {
	if r.health != nil {
		r.health.QueuedUpdate()
	}
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// OnApplied registers fn to be called after every successful sync with the
// snapshot that is now in the kernel. snap.Dirty then lists every Service
// changed since the previous call, also those of syncs that failed in
// between, so that fn may look at those only. fn runs on the sync
// goroutine and must not keep snap.Services after it returns.
func (r *Runner) OnApplied(fn func(*portal.Snapshot)) {
	r.mu.Lock()
	r.onApplied = append(r.onApplied, fn)
	r.mu.Unlock()
}

// OnServicePanic registers fn to be called, on the sync goroutine, for each
// Service a sync left out because rendering it panicked (the runner logs
// it with its stack and counts it; fn typically records an event).
func (r *Runner) OnServicePanic(fn func(ServicePanic)) {
	r.mu.Lock()
	r.onPanic = append(r.onPanic, fn)
	r.mu.Unlock()
}

// OnServiceProblem registers fn to be called, on the sync goroutine, for
// each problem a sync's SyncStats.Problems lists (the runner logs and counts
// it; fn typically records an event on the Service).
func (r *Runner) OnServiceProblem(fn func(portal.Problem)) {
	r.mu.Lock()
	r.onProblem = append(r.onProblem, fn)
	r.mu.Unlock()
}

// OnRepair registers fn to be called, on the sync goroutine, for each change
// someone else made to the kernel state that the runner repairs (it logs
// and counts it; fn typically records an event on the Node).
func (r *Runner) OnRepair(fn func(KernelChange)) {
	r.mu.Lock()
	r.onRepair = append(r.onRepair, fn)
	r.mu.Unlock()
}

// repair logs, counts and reports a change someone else made to the
// kernel state; the caller then syncs in full.
func (r *Runner) repair(ctx context.Context, c KernelChange) {
	report(r, &r.onRepair, []KernelChange{c}, func(c KernelChange) {
		r.log.WarnContext(ctx, "kernel state changed behind onehop's back; rewriting it", "backend", r.dp.Name(), "seen", c.String())
		r.metrics.KernelRepaired(r.dp.Name())
	})
}

// watch starts the dataplane's Watch when it has one; a nil channel (never
// ready) when it has none or it failed, and then Check alone notices.
func (r *Runner) watch(ctx context.Context) <-chan KernelChange {
	w, ok := r.dp.(Watcher)
	if !ok {
		return nil
	}
	ch, err := w.Watch(ctx)
	if err != nil {
		r.log.Warn("cannot watch the kernel for changes by others; checking periodically only", "backend", r.dp.Name(), "err", err)
		return nil
	}
	return ch
}

// Run syncs until ctx ends. The first sync is full; later ones send only
// changes, unless the previous failed, the kernel was changed behind our
// back, or FullSyncPeriod has passed.
func (r *Runner) Run(ctx context.Context) {
	full := true
	var lastFull time.Time
	pace := newPacer(r.cfg.MinSyncPeriod, time.Now())
	backoff := time.Duration(0)
	check := time.NewTicker(r.cfg.CheckPeriod)
	defer check.Stop()
	periodic := time.NewTimer(0) // first sync at once
	defer periodic.Stop()
	changes := r.watch(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
		case <-periodic.C:
		case c, ok := <-changes:
			if !ok {
				changes = nil // Check goes on
				continue
			}
			switch {
			case full: // a full sync is due anyway
			case len(c.Seen) == 0:
				// Only lost events: most often those of the
				// backend's own large sync, which overflowed the
				// socket. A full sync compares the whole table; it
				// is no repair until something was seen.
				r.log.InfoContext(ctx, "kernel events lost; comparing the whole table", "backend", r.dp.Name())
			default:
				r.repair(ctx, c)
			}
			full = true
		case <-check.C:
			if full {
				break // a full sync is due anyway
			}
			if err := r.dp.Check(ctx); err != nil {
				r.repair(ctx, KernelChange{Seen: []string{err.Error()}})
				full = true
				break
			}
			continue
		}
		if wait := pace.wait(time.Now()); wait > 0 {
			if !sleep(ctx, wait) {
				return
			}
		}
		if backoff > 0 && !sleep(ctx, backoff) {
			return
		}
		if time.Since(lastFull) > r.cfg.FullSyncPeriod {
			full = true
		}
		stats, err := r.syncOnce(ctx, full)
		if err != nil || stats.Full || stats.Messages > 0 {
			// Paced by the dataplane's own work (its CPU time, not the
			// time it waited for a CPU): what runs after it (conntrack
			// cleanup, health checks) has its own limits.
			now := time.Now()
			pace.spent(now, stats.CPU)
			r.lastBusy.Store(now.UnixNano())
		}
		if err != nil {
			full = true
			backoff = min(max(2*backoff, 500*time.Millisecond), r.cfg.MaxBackoff)
			r.log.Error("sync failed; retrying with a full sync", "backend", r.dp.Name(), "retry_in", backoff, "err", err)
			periodic.Reset(0)
			continue
		}
		if full {
			lastFull = time.Now()
		}
		full, backoff = false, 0
		periodic.Reset(r.cfg.SyncPeriod)
	}
}

// SyncOnce takes a snapshot and applies it.
func (r *Runner) SyncOnce(ctx context.Context, full bool) error {
	_, err := r.syncOnce(ctx, full)
	return err
}

func (r *Runner) syncOnce(ctx context.Context, full bool) (SyncStats, error) {
	snap, triggers := r.src.Snapshot()
	stats, err := r.syncMeasured(ctx, snap, full)
	r.metrics.ObserveSync(stats, err)
	r.reportPanics(ctx, stats.Panics)
	r.reportProblems(ctx, stats.Problems)
	if err != nil {
		if r.unapplied == nil {
			r.unapplied = map[portal.ServiceKey]struct{}{}
		}
		for _, k := range snap.Dirty {
			r.unapplied[k] = struct{}{}
		}
		return stats, err
	}
	if len(r.unapplied) > 0 {
		for _, k := range snap.Dirty {
			delete(r.unapplied, k)
		}
		dirty := slices.Clone(snap.Dirty)
		for k := range r.unapplied {
			dirty = append(dirty, k)
		}
		snap.Dirty, r.unapplied = dirty, nil
	}
	level := slog.LevelDebug
	if stats.Full || stats.Changed > 0 {
		level = slog.LevelInfo
	}
	r.log.Log(ctx, level, "synced", "backend", r.dp.Name(), "full", stats.Full, "services", stats.Services,
		"changed_portals", stats.Changed, "messages", stats.Messages, "elements", stats.Elements, "duration", stats.Duration, "cpu", stats.CPU)
	now := time.Now()
	for _, t := range triggers {
		r.metrics.ObserveProgramming(now.Sub(t))
	}
	if r.health != nil {
		r.health.Updated()
	}
	r.mu.Lock()
	fns := r.onApplied
	r.mu.Unlock()
	for _, fn := range fns {
		fn(snap)
	}
	return stats, nil
}

// syncMeasured runs the dataplane's Sync on one OS thread and records the
// CPU time that thread spent in stats.CPU (the wall time when the thread's
// CPU time cannot be read).
func (r *Runner) syncMeasured(ctx context.Context, snap *portal.Snapshot, full bool) (SyncStats, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0, cpuErr := threadCPU()
	stats, err := r.dp.Sync(ctx, snap, full)
	stats.CPU = stats.Duration
	if cpu1, err1 := threadCPU(); cpuErr == nil && err1 == nil {
		stats.CPU = cpu1 - cpu0
	}
	return stats, err
}

// threadCPU is the calling OS thread's CPU time, user and system.
func threadCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (r *Runner) reportPanics(ctx context.Context, panics []ServicePanic) {
	report(r, &r.onPanic, panics, func(p ServicePanic) {
		r.log.ErrorContext(ctx, "recovered a panic while rendering a Service; it is left out of the dataplane",
			"backend", r.dp.Name(), "service", p.Service.String(), "err", p.Err.Error(), "stack", string(p.Err.Stack))
	})
}

func (r *Runner) reportProblems(ctx context.Context, problems []portal.Problem) {
	report(r, &r.onProblem, problems, func(p portal.Problem) {
		r.log.WarnContext(ctx, "a Service is not programmed as asked; the other Services are",
			"backend", r.dp.Name(), "service", p.Service.String(), "reason", p.Reason, "err", p.Message)
	})
}

// report logs each item and hands it to the handlers registered in *fns.
func report[T any](r *Runner, fns *[]func(T), items []T, log func(T)) {
	if len(items) == 0 {
		return
	}
	r.mu.Lock()
	handlers := *fns
	r.mu.Unlock()
	for _, it := range items {
		log(it)
		for _, fn := range handlers {
			fn(it)
		}
	}
}
