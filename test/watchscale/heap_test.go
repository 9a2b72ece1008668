package watchscale

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/cluster"
)

// TestAgentHeap measures one node agent's live heap with its informers
// synced (ONEHOP_WATCHSCALE_HEAP=<Services>, each with one EndpointSlice
// of 10 endpoints), with the model and the hook each watching Services
// and EndpointSlices, then with one watch shared (portal.ServiceWatch). The
// shared agent must hold less.
func TestAgentHeap(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("ONEHOP_WATCHSCALE_HEAP"))
	if n <= 0 {
		t.Skip("skipping: set ONEHOP_WATCHSCALE_HEAP to a number of Services")
	}
	controlPlane(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	cp, err := cluster.Start(ctx, cluster.Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 1000, 1000
	admin, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	const nodes = 10
	if err := populate(ctx, admin, shape{nodes: nodes, podsPerNode: 1}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := populateServices(ctx, admin, n, nodes); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Services with 10 endpoints each created in %v", n, time.Since(start).Round(time.Second))
	heap := map[bool]uint64{}
	for _, shared := range []bool{false, true} {
		base := liveHeap()
		actx, stop := context.WithCancel(ctx)
		a, err := startAgent(actx, cp.RESTConfig(), nodeName(0), hookConfig(true), shared)
		if err != nil {
			stop()
			t.Fatal(err)
		}
		err = waitSynced(actx, []*agent{a})
		time.Sleep(2 * time.Second) // the handlers' work after the listing
		heap[shared] = liveHeap() - base
		stop()
		<-a.done
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("shared=%v: live heap %.1f MiB over the process's before the agent", shared, float64(heap[shared])/(1<<20))
	}
	if heap[true] >= heap[false] {
		t.Errorf("with one shared watch the agent holds %d bytes, without %d", heap[true], heap[false])
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// populateServices creates n Services in simNamespace, each with a
// selector and one EndpointSlice of 10 endpoints as the EndpointSlice
// controller writes them (target refs, zones, owner reference, labels).
func populateServices(ctx context.Context, c kubernetes.Interface, n, nodes int) error {
	work := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if err := createService(ctx, c, i, nodes); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for i := range n {
		select {
		case work <- i:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

func createService(ctx context.Context, c kubernetes.Interface, i, nodes int) error {
	name := "heap-" + strconv.Itoa(i)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: simNamespace, Labels: map[string]string{"app": name, "team": "shop"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	svc, err := c.CoreV1().Services(simNamespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	port, proto, yes := int32(8080), corev1.ProtocolTCP, true
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-a", Namespace: simNamespace,
			Labels:          map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", "app": name, "team": "shop"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: svc.UID, Controller: &yes, BlockOwnerDeletion: &yes}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: &port, Protocol: &proto}},
	}
	for j := range 10 {
		node := (i + j) % nodes
		pod := fmt.Sprintf("%s-%d", name, j)
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+i/250, i%250, 2+j)},
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: ptr(false)},
			NodeName:   ptr(nodeName(node)), Zone: ptr("zone-" + strconv.Itoa(node%3)),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: simNamespace, Name: pod},
		})
	}
	_, err = c.DiscoveryV1().EndpointSlices(simNamespace).Create(ctx, sl, metav1.CreateOptions{})
	return err
}
