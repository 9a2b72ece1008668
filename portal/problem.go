package portal

import "fmt"

// Problem is an input the model refused: a bad value in a Service or
// EndpointSlice. The rest of the object is still used, except after a
// ServiceTooLarge or an InternalError, which leave the whole Service out.
// Problems become Kubernetes events on the Service and log lines.
type Problem struct {
	Service ServiceKey
	Reason  string // CamelCase, as Kubernetes event reasons
	Message string
	// Panic is set when the Problem is a panic onehop recovered from
	// (Reason ReasonPanic): its stack is for the log, not the event.
	Panic *PanicError
}

func (p Problem) String() string { return fmt.Sprintf("%s: %s: %s", p.Service, p.Reason, p.Message) }

// Reasons of Problems.
const (
	ReasonInvalidClusterIP  = "InvalidClusterIP"
	ReasonInvalidPort       = "InvalidPort"
	ReasonInvalidEndpoint   = "InvalidEndpoint"
	ReasonExternalIPRefused = "ExternalIPNotAllowed"
	ReasonInvalidIngressIP  = "InvalidLoadBalancerIP"
	ReasonPortConflict      = "PortConflict"
	ReasonInvalidScheduler  = "InvalidScheduler"
	// ReasonTooLarge: the Service is over one of the Limits; it is left out
	// as a whole until it fits.
	ReasonTooLarge = "ServiceTooLarge"
	// ReasonPanic: building or programming the Service panicked; it is
	// left out until it changes. A bug in onehop, not in the Service.
	ReasonPanic = "InternalError"
)
