package dataplane

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// MemoryReleaser gives back to the OS the heap that a burst of work left
// free, once the agent is idle. The first listing of a large cluster, or a
// storm of changes, grows the heap well above what the agent keeps; Go's
// scavenger returns only what is above the next GC's goal, twice the live
// heap, so without this the burst's high-water mark stays resident for
// good. One release (a GC, then the free pages returned) per burst, after
// Idle without a sync, when at least MinFree bytes are free.
type MemoryReleaser struct {
	// LastBusy tells when the agent last did work (the end of its last sync).
	LastBusy func() time.Time
	Idle     time.Duration // default 5s
	MinFree  uint64        // default 16 MiB
	Log      *slog.Logger

	// free and release are the runtime's; tests replace them.
	free    func() uint64
	release func()
}

// Run releases memory after each burst until ctx ends.
func (m *MemoryReleaser) Run(ctx context.Context) {
	if m.Idle <= 0 {
		m.Idle = 5 * time.Second
	}
	if m.MinFree == 0 {
		m.MinFree = 16 << 20
	}
	if m.free == nil {
		m.free = heapFree
	}
	if m.release == nil {
		m.release = debug.FreeOSMemory
	}
	tick := time.NewTicker(m.Idle / 2)
	defer tick.Stop()
	var released time.Time // the LastBusy that the last release followed
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		busy := m.LastBusy()
		if busy.IsZero() || busy.Equal(released) || time.Since(busy) < m.Idle {
			continue
		}
		released = busy
		if free := m.free(); free >= m.MinFree {
			m.release()
			if m.Log != nil {
				m.Log.Debug("idle: returned free heap to the OS", "free_before", free, "free_after", m.free())
			}
		}
	}
}

// heapFree is the heap memory that is free and not yet returned to the OS.
func heapFree() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
