package dataplane

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// One release per burst, only once idle, only when enough is free.
func TestMemoryReleaserOncePerBurst(t *testing.T) {
	var mu sync.Mutex
	busy := time.Now()
	setBusy := func(at time.Time) { mu.Lock(); busy = at; mu.Unlock() }
	var free atomic.Uint64
	free.Store(64 << 20)
	var releases atomic.Int32
	m := &MemoryReleaser{
		LastBusy: func() time.Time { mu.Lock(); defer mu.Unlock(); return busy },
		Idle:     40 * time.Millisecond,
		MinFree:  16 << 20,
		free:     free.Load,
		release:  func() { releases.Add(1); free.Store(1 << 20) },
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go m.Run(ctx)

	waitFor := func(want int32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for releases.Load() != want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := releases.Load(); got != want {
			t.Fatalf("releases = %d, want %d", got, want)
		}
	}
	waitFor(1) // idle after the first burst
	time.Sleep(200 * time.Millisecond)
	waitFor(1) // nothing new: no second release

	free.Store(64 << 20)
	setBusy(time.Now()) // a new burst
	waitFor(2)

	free.Store(1 << 20) // too little free after the next one
	setBusy(time.Now())
	time.Sleep(200 * time.Millisecond)
	waitFor(2)
}

// The runtime's figure counts garbage made since the last GC, and a
// release brings it down.
func TestHeapReclaimableCountsGarbage(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no GC but ours
	runtime.GC()
	var sink []byte
	for range 64 {
		sink = make([]byte, 1<<20) // garbage at once, but the last
	}
	runtime.KeepAlive(sink)
	if got := heapReclaimable(); got < 32<<20 {
		t.Errorf("with 63 MiB of garbage, reclaimable = %d MiB, want at least 32", got>>20)
	}
	debug.FreeOSMemory()
	if got := heapReclaimable(); got > 16<<20 {
		t.Errorf("after a release, reclaimable = %d MiB, want little", got>>20)
	}
}
