package portal

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
)

// build builds Service k from svc and its slices and claims its ways in.
//
// A panic in either is confined to k: k gets no portals at all, its claims
// are released (the Services that lost one to it are returned, to be built
// again), and the panic becomes a Problem, hence an event on k. Dropping k
// is safer than keeping its last good portals: those would keep sending
// traffic to endpoints that may be gone (and whose IPs may already belong to
// another tenant's pods), keep holding addresses k may have given up, and
// differ between an agent that saw the old version and one that just
// restarted. Dropped, k is served nowhere, the same on every node, until a
// change to it builds.
func (t *Tracker) build(k ServiceKey, svc *v1.Service) (built *Service, problems []Problem, again []ServiceKey) {
	perr := Catch(func() {
		built, problems = t.cfg.Build(t.withoutRefused(k, svc), sliceList(t.slices[k]))
		if built != nil {
			problems = append(problems, t.claims.take(built)...)
		}
	})
	if perr == nil {
		return built, problems, nil
	}
	return nil, []Problem{PanicProblem(k, "building its portals", perr)}, t.claims.release(k)
}

// PanicProblem is the Problem reported on Service k when doing what
// panicked with perr.
func PanicProblem(k ServiceKey, doing string, perr *PanicError) Problem {
	return Problem{Service: k, Reason: ReasonPanic, Panic: perr, Message: fmt.Sprintf(
		"onehop failed while %s (%v); the Service is not served by this node until it changes. "+
			"This is a bug in onehop: please report it with this message", doing, perr)}
}
