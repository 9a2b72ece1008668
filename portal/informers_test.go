package portal

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// TestInformersSyncedMeansTrackerHasEverything: the agent's first sync
// replaces the whole ruleset, so "synced" must mean every listed object
// has reached the Tracker, not only the informers' stores (the handlers run
// behind them). A slow handler makes the difference visible.
func TestInformersSyncedMeansTrackerHasEverything(t *testing.T) {
	const n = 300
	var objs []runtime.Object
	for i := 0; i < n; i++ {
		objs = append(objs, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1),
				ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
				Ports:      []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80}}},
		})
	}
	client := fake.NewClientset(objs...)
	tr := NewTracker(Config{NodeName: "n1"}, nil, func() { time.Sleep(time.Millisecond) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	synced, err := (&Informers{Client: client, NodeName: "n1"}).Start(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitForSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	missing := 0
	for i := 0; i < n; i++ {
		if tr.Service(ServiceKey{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}) == nil {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("informers reported synced with %d of %d Services not yet in the Tracker", missing, n)
	}
}
