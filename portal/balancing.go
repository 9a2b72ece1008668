package portal

import "fmt"

// Balancing is how a Service port picks an endpoint for a new connection.
type Balancing uint8

// The ways to balance. The zero value is random, the default.
const (
	// BalancingRandom picks an endpoint at random for each new connection.
	BalancingRandom Balancing = iota
	// BalancingMaglev picks by a hash of the connection's 5-tuple in a
	// Maglev lookup table (dataplane.MaglevTable): every node with the same
	// endpoints sends a flow to the same one, so that a flow an ECMP router
	// moves to another node still reaches its pod, and an endpoint that
	// goes away moves about its own share of flows only.
	BalancingMaglev
)

// AnnotationBalancing chooses a Service's Balancing: "random" or "maglev".
// Without it, the cluster-wide default (Config.Balancing) applies.
const AnnotationBalancing = "onehop.io/balancing"

// ReasonInvalidBalancing: the Service's onehop.io/balancing annotation has
// an unknown value; the cluster-wide default applies.
const ReasonInvalidBalancing = "InvalidBalancing"

var balancingNames = []string{BalancingRandom: "random", BalancingMaglev: "maglev"}

func (b Balancing) String() string {
	if int(b) < len(balancingNames) {
		return balancingNames[b]
	}
	return fmt.Sprintf("balancing-%d", uint8(b))
}

// ParseBalancing parses "random" or "maglev".
func ParseBalancing(s string) (Balancing, bool) {
	for i, n := range balancingNames {
		if s == n {
			return Balancing(i), true
		}
	}
	return BalancingRandom, false
}

// balancing returns the Service's Balancing: its annotation's, else the
// default. An unknown value is a Problem, and the default applies.
func (b *builder) balancing() Balancing {
	v, ok := b.svc.Annotations[AnnotationBalancing]
	if !ok {
		return b.cfg.Balancing
	}
	bal, ok := ParseBalancing(v)
	if !ok {
		b.problem(ReasonInvalidBalancing, "annotation %s: unknown value %q (want %q or %q); using the cluster's default",
			AnnotationBalancing, v, BalancingRandom, BalancingMaglev)
		return b.cfg.Balancing
	}
	return bal
}
