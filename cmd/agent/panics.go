package main

import (
	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// panicCounter passes Problems on to a Reporter, counting those that are
// panics recovered while building a Service in onehop_service_panics_total.
type panicCounter struct {
	portal.Reporter
	metrics *dataplane.Metrics
}

// Report implements portal.Reporter.
func (r panicCounter) Report(svc *v1.Service, problems []portal.Problem) {
	n := 0
	for _, p := range problems {
		if p.Panic != nil {
			n++
		}
	}
	r.metrics.ServicePanics(dataplane.PanicStageBuild, n)
	r.Reporter.Report(svc, problems)
}
