package dataplane

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/portal"
)

// partial is a Dataplane whose Sync reports one problem and succeeds.
type partial struct{ problem portal.Problem }

func (d *partial) Name() string { return "test" }
func (d *partial) Sync(_ context.Context, _ *portal.Snapshot, full bool) (SyncStats, error) {
	return SyncStats{Full: full, Problems: []portal.Problem{d.problem}}, nil
}
func (d *partial) Check(context.Context) error         { return nil }
func (d *partial) Dump(context.Context) (*Dump, error) { return &Dump{}, nil }
func (d *partial) Cleanup(context.Context) error       { return nil }

func TestRunnerReportsServiceProblems(t *testing.T) {
	k := portal.ServiceKey{Namespace: "ns", Name: "twos"}
	dp := &partial{problem: portal.Problem{Service: k, Reason: portal.ReasonInvalidScheduler, Message: "no such scheduler"}}
	reg := prometheus.NewPedanticRegistry()
	r := NewRunner(dp, fixedSource{&portal.Snapshot{}}, RunnerConfig{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, NewMetrics(reg))
	var got []portal.Problem
	r.OnServiceProblem(func(p portal.Problem) { got = append(got, p) })
	if err := r.SyncOnce(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != dp.problem {
		t.Fatalf("handler got %+v, want the backend's problem once", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "onehop_service_dataplane_problems_total" {
			for _, s := range mf.GetMetric() {
				if s.GetLabel()[0].GetValue() == portal.ReasonInvalidScheduler {
					n += s.GetCounter().GetValue()
				}
			}
		}
	}
	if n != 1 {
		t.Errorf("onehop_service_dataplane_problems_total{reason=InvalidScheduler} = %v, want 1", n)
	}
}
