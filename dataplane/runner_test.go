package dataplane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
)

// failing is a Dataplane whose Sync fails while fail is set.
type failing struct{ fail bool }

func (d *failing) Name() string { return "test" }
func (d *failing) Sync(context.Context, *portal.Snapshot, bool) (SyncStats, error) {
	if d.fail {
		return SyncStats{}, errors.New("kernel said no")
	}
	return SyncStats{}, nil
}
func (d *failing) Check(context.Context) error         { return nil }
func (d *failing) Dump(context.Context) (*Dump, error) { return &Dump{}, nil }
func (d *failing) Cleanup(context.Context) error       { return nil }

// queue hands out its snapshots in order.
type queue struct{ snaps []*portal.Snapshot }

func (q *queue) Snapshot() (*portal.Snapshot, []time.Time) {
	s := q.snaps[0]
	q.snaps = q.snaps[1:]
	return s, nil
}

// OnApplied functions may look at Dirty only: the Services of a snapshot
// whose sync failed are listed again after the next successful one.
func TestOnAppliedSeesChangesOfFailedSyncs(t *testing.T) {
	key := func(n string) portal.ServiceKey { return portal.ServiceKey{Namespace: "ns", Name: n} }
	snap := func(dirty ...string) *portal.Snapshot {
		s := &portal.Snapshot{Services: map[portal.ServiceKey]*portal.Service{}}
		for _, n := range dirty {
			s.Dirty = append(s.Dirty, key(n))
		}
		return s
	}
	src := &queue{snaps: []*portal.Snapshot{snap("a"), snap("b", "c"), snap("c", "d"), snap("e")}}
	dp := &failing{}
	r := NewRunner(dp, src, RunnerConfig{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	var seen [][]string
	r.OnApplied(func(s *portal.Snapshot) {
		var names []string
		for _, k := range s.Dirty {
			names = append(names, k.Name)
		}
		slices.Sort(names)
		seen = append(seen, names)
	})
	for i, fail := range []bool{false, true, false, false} {
		dp.fail = fail
		err := r.SyncOnce(t.Context(), true)
		if (err != nil) != fail {
			t.Fatalf("sync %d: err %v", i, err)
		}
	}
	want := [][]string{{"a"}, {"b", "c", "d"}, {"e"}}
	if !slices.EqualFunc(seen, want, slices.Equal) {
		t.Errorf("OnApplied saw Dirty %v, want %v", seen, want)
	}
}

func TestPacer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	p := newPacer(0, t0)
	// A few cheap changes in a row: at once.
	for i := range 10 {
		if w := p.wait(at(i * 10)); w != 0 {
			t.Fatalf("change %d: wait %v, want none while the budget lasts", i, w)
		}
		p.spent(at(i*10), 5*time.Millisecond)
	}
	// A storm: the budget is spent, and the syncs wait until it is back,
	// so that they take about PaceShare of the time.
	now, busy := at(100), time.Duration(0)
	for range 200 {
		now = now.Add(p.wait(now))
		p.spent(now, 20*time.Millisecond)
		busy += 20 * time.Millisecond
	}
	if share := float64(busy) / float64(now.Sub(t0)); share > PaceShare*1.5 || share < PaceShare*0.5 {
		t.Errorf("in a storm syncing took %.3f of the time, want about %.2f", share, PaceShare)
	}
	// One huge sync holds the next for MaxPace at most.
	p = newPacer(0, t0)
	p.spent(t0, 10*time.Second)
	if w := p.wait(t0); w != MaxPace {
		t.Errorf("after a 10 s sync: wait %v, want %v", w, MaxPace)
	}
	// A quiet time refills the budget: a lone change after it goes at once.
	if w := p.wait(t0.Add(PaceBurst * 30)); w != 0 {
		t.Errorf("after a quiet time: wait %v, want none", w)
	}
	// --min-sync-period is kept between syncs that changed the kernel.
	p = newPacer(time.Second, t0)
	if w := p.wait(t0); w != 0 {
		t.Errorf("first sync with a min period: wait %v, want none", w)
	}
	p.spent(t0, time.Millisecond)
	if w := p.wait(at(300)); w != 700*time.Millisecond {
		t.Errorf("300 ms after a sync with a 1 s min period: wait %v, want 700ms", w)
	}
}
