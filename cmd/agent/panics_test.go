package main

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

type recorded struct{ got []portal.Problem }

func (r *recorded) Report(_ *v1.Service, ps []portal.Problem) { r.got = append(r.got, ps...) }

// Problems reach the reporter unchanged; the panics among them are counted.
func TestPanicCounter(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := dataplane.NewMetrics(reg)
	rec := &recorded{}
	r := panicCounter{rec, m}
	k := portal.ServiceKey{Namespace: "ns", Name: "web"}
	perr := portal.Catch(func() { panic("boom") })
	r.Report(&v1.Service{}, []portal.Problem{
		{Service: k, Reason: portal.ReasonInvalidPort, Message: "bad port"},
		portal.PanicProblem(k, "building its portals", perr),
	})
	if len(rec.got) != 2 || rec.got[1].Reason != portal.ReasonPanic {
		t.Errorf("reporter got %+v", rec.got)
	}
	want := `
# HELP onehop_service_panics_total Panics recovered while building one Service's portals (stage build) or rendering them in the dataplane (stage render); each left that Service out and gave it an event.
# TYPE onehop_service_panics_total counter
onehop_service_panics_total{stage="build"} 1
onehop_service_panics_total{stage="render"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "onehop_service_panics_total"); err != nil {
		t.Error(err)
	}
}
