package dataplane

import "github.com/onehop/onehop/portal"

// ServicePanic is a panic a backend recovered while rendering one Service.
// The backend leaves that Service out of the sync, as if it had been
// deleted (its kernel objects are removed), and every other Service syncs.
// The runner logs and counts it and hands it to OnServicePanic handlers.
type ServicePanic struct {
	Service portal.ServiceKey
	Backend string // the backend's Name
	Err     *portal.PanicError
}

// Problem is the panic as a Problem on its Service, for an event.
func (p ServicePanic) Problem() portal.Problem {
	return portal.PanicProblem(p.Service, "programming it in the "+p.Backend+" dataplane", p.Err)
}

// CatchServicePanic runs fn, which renders Service k for backend, and
// returns the panic it raised as a ServicePanic (nil when it returned).
func CatchServicePanic(backend string, k portal.ServiceKey, fn func()) *ServicePanic {
	if err := portal.Catch(fn); err != nil {
		return &ServicePanic{Service: k, Backend: backend, Err: err}
	}
	return nil
}
