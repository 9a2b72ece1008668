package leases_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/onehop/onehop/external/leases"
)

// TestLivenessWakesOnceListed: this node renewed its Lease before the
// Lease informer listed it, so the node is not alive to itself until the
// listing is observed. Then the hook is woken, and looks while the node is
// alive: its L2 provider claims its IPs then, not at some later change
// of the cluster that may never come. Whether the informer counts as
// synced before or after the listing reaches the tracker is up to
// client-go's goroutines; the rounds give both orders their chance.
func TestLivenessWakesOnceListed(t *testing.T) {
	for round := range 200 {
		renewed := metav1.NewMicroTime(time.Now())
		client := fake.NewClientset(&coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: leases.LeasePrefix + "a", Namespace: "default",
				Labels: map[string]string{"app.kubernetes.io/managed-by": "onehop"}},
			Spec: coordinationv1.LeaseSpec{RenewTime: &renewed}})
		var l *leases.Liveness
		var watching, woke atomic.Bool
		// The hook's look at a wake-up: is this node alive now?
		l = leases.NewLiveness(client, "default", "a", time.Second, 3*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)), func() {
			if watching.Load() && l.Alive("a") {
				woke.Store(true)
			}
		})
		l.RenewedOwn()
		watching.Store(true)
		ctx, cancel := context.WithCancel(context.Background())
		stop, err := l.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); !woke.Load() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		alive := l.Alive("a")
		cancel()
		stop()
		if !woke.Load() {
			t.Fatalf("round %d: the hook was never woken while this node was alive to itself (alive now: %v)", round, alive)
		}
	}
}
