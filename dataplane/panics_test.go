package dataplane

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/portal"
)

// panicky is a Dataplane whose Sync renders each Service with render,
// confining panics to their Service as the real backends do.
type panicky struct {
	render  func(*portal.Service)
	applied []portal.ServiceKey
}

func (d *panicky) Name() string { return "test" }
func (d *panicky) Sync(_ context.Context, snap *portal.Snapshot, full bool) (SyncStats, error) {
	st := SyncStats{Full: full}
	d.applied = nil
	for k, s := range snap.Services {
		if p := CatchServicePanic(d.Name(), k, func() { d.render(s) }); p != nil {
			st.Panics = append(st.Panics, *p)
			continue
		}
		d.applied = append(d.applied, k)
	}
	return st, nil
}
func (d *panicky) Check(context.Context) error         { return nil }
func (d *panicky) Dump(context.Context) (*Dump, error) { return &Dump{}, nil }
func (d *panicky) Cleanup(context.Context) error       { return nil }

type fixedSource struct{ snap *portal.Snapshot }

func (s fixedSource) Snapshot() (*portal.Snapshot, []time.Time) { return s.snap, nil }

func TestRunnerReportsServicePanics(t *testing.T) {
	good, bad := portal.ServiceKey{Namespace: "ns", Name: "good"}, portal.ServiceKey{Namespace: "ns", Name: "bad"}
	snap := &portal.Snapshot{Services: map[portal.ServiceKey]*portal.Service{
		good: {Key: good, Portals: []*portal.Portal{{Port: 80}}},
		bad:  {Key: bad, Portals: []*portal.Portal{nil}},
	}}
	dp := &panicky{render: func(s *portal.Service) {
		for _, p := range s.Portals {
			_ = p.Port // nil for bad
		}
	}}
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	r := NewRunner(dp, fixedSource{snap}, RunnerConfig{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, m)
	var got []ServicePanic
	r.OnServicePanic(func(p ServicePanic) { got = append(got, p) })
	for range 2 {
		if err := r.SyncOnce(t.Context(), true); err != nil {
			t.Fatal(err)
		}
	}
	if len(dp.applied) != 1 || dp.applied[0] != good {
		t.Errorf("the good Service must be applied, got %v", dp.applied)
	}
	if len(got) != 2 || got[0].Service != bad || got[0].Backend != "test" {
		t.Fatalf("want the bad Service's panic once per sync, got %+v", got)
	}
	pr := got[0].Problem()
	if pr.Reason != portal.ReasonPanic || pr.Service != bad || !strings.Contains(pr.Message, "test dataplane") ||
		!strings.Contains(pr.Message, "panics_test.go:") {
		t.Errorf("problem: got %+v", pr)
	}
	m.ServicePanics(PanicStageBuild, 1)
	counts := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "onehop_service_panics_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			counts[s.GetLabel()[0].GetValue()] = s.GetCounter().GetValue()
		}
	}
	if counts[PanicStageRender] != 2 || counts[PanicStageBuild] != 1 {
		t.Errorf("onehop_service_panics_total: got %v, want render 2, build 1", counts)
	}
}
