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
// Idle without a sync, when the heap holds at least MinFree bytes more than
// the live data (garbage not yet collected counts: the GC frees it first).
type MemoryReleaser struct {
	// LastBusy tells when the agent last did work (the end of its last sync).
	LastBusy func() time.Time
	Idle     time.Duration // default 5s
	MinFree  uint64        // default 16 MiB
	Log      *slog.Logger

	// free (what a release could give back) and release are the
	// runtime's; tests replace them.
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
		m.free = heapReclaimable
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
				m.Log.Debug("idle: returned the heap beyond the live data to the OS", "reclaimable_before", free, "reclaimable_after", m.free())
			}
		}
	}
}

// heapReclaimable is the heap memory the process holds beyond the live
// data of the last GC: garbage, and free pages not yet returned to the OS.
func heapReclaimable() uint64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	var v [4]uint64
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		v[i] = s[i].Value.Uint64()
	}
	held := v[0] + v[1] + v[2]
	if held < v[3] {
		return 0
	}
	return held - v[3]
}
