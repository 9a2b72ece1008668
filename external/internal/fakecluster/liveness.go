package fakecluster

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/leases"
)

// Clocked is the liveness tracker of node "a" (renew 1 s, duration 3 s)
// on a hand-driven clock, with its Leases listed.
type Clocked struct {
	*leases.Liveness
	T       *testing.T
	Clock   time.Time
	RV      map[string]int
	Resumes int
	// Changes counts the hook's wake-ups (changed).
	Changes int
}

// NewClocked is a Clocked, its own Lease renewed once when renewed.
func NewClocked(t *testing.T, renewed bool) *Clocked {
	c := &Clocked{T: t, Clock: time.Unix(1_000_000, 0), RV: map[string]int{}}
	c.Liveness = leases.NewLiveness(nil, "default", "a", time.Second, 3*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)), func() { c.Changes++ })
	c.UseClock(func() time.Time { return c.Clock })
	c.OnResumed(func() { c.Resumes++ })
	if renewed {
		c.RenewedOwn()
	}
	return c
}

// Renewed: the nodes' Leases changed and the watch delivered them now.
func (c *Clocked) Renewed(nodes ...string) {
	for _, n := range nodes {
		c.RV[n]++
		rt := metav1.NewMicroTime(c.Clock)
		c.Observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leases.LeasePrefix + n, ResourceVersion: strconv.Itoa(c.RV[n])},
			Spec: coordinationv1.LeaseSpec{RenewTime: &rt}})
	}
}

// Advance moves the clock in steps of step, renewing the given nodes'
// Leases (through the watch) at each step.
func (c *Clocked) Advance(d, step time.Duration, renewing ...string) {
	for end := c.Clock.Add(d); c.Clock.Before(end); {
		c.Clock = c.Clock.Add(step)
		c.Renewed(renewing...)
	}
}

// Want fails the test unless each node of alive is alive as it says.
func (c *Clocked) Want(what string, alive map[string]bool) {
	c.T.Helper()
	for n, w := range alive {
		if got := c.Alive(n); got != w {
			c.T.Errorf("%s: alive(%s) = %v, want %v", what, n, got, w)
		}
	}
}
