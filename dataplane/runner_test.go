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

func TestPace(t *testing.T) {
	for _, c := range []struct {
		min, took, want time.Duration
	}{
		{0, 0, 0}, // a lone change after a quiet time: at once
		{0, 2 * time.Millisecond, 40 * time.Millisecond}, // cheap syncs come often
		{0, 200 * time.Millisecond, MaxPace},             // never more than MaxPace
		{time.Second, time.Millisecond, time.Second},     // --min-sync-period is a floor
		{5 * time.Second, time.Second, 5 * time.Second},  // also above MaxPace
	} {
		cfg := RunnerConfig{MinSyncPeriod: c.min}
		if got := cfg.Pace(c.took); got != c.want {
			t.Errorf("Pace(min %v, took %v) = %v, want %v", c.min, c.took, got, c.want)
		}
	}
}
