package netns_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/netns"
)

// EnvMemoryServices, when set to a number of Services, runs
// TestAgentMemoryWithinLimit at that scale (10000 is what the DaemonSet's
// memory limit was picked from; creating them takes minutes).
const EnvMemoryServices = "ONEHOP_MEMORY_SERVICES"

// TestAgentMemoryWithinLimit: an agent's peak RSS, with N Services of one
// 10-endpoint EndpointSlice each, stays under the memory limit of
// deploy/base's DaemonSet. The RSS is logged idle and per 1,000 Services.
func TestAgentMemoryWithinLimit(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(EnvMemoryServices))
	if n <= 0 {
		t.Skipf("set %s to a number of Services (10000: the DaemonSet's limit's measurement)", EnvMemoryServices)
	}
	limit := daemonSetMemoryLimit(t)
	c := netns.NewForTest(t, netns.Config{Nodes: 1, PodsPerNode: 1})
	node := c.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	rss := func(what string) int64 {
		t.Helper()
		b, err := c.AgentPeakRSS(node)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: agent peak RSS %d MiB", what, b>>20)
		return b
	}
	rss("idle")
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				if err := createScaleService(ctx, c, i); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range n {
		if i > 0 && i%1000 == 0 {
			rss(fmt.Sprintf("%d Services", i))
		}
		work <- i
	}
	close(work)
	wg.Wait()
	// The agent has synced them all when its rules hold a port per Service
	// (and the kubernetes Service's).
	deadline := time.Now().Add(5 * time.Minute)
	for {
		out, err := c.DumpRules(ctx, node, "table")
		var backend string
		var ports int
		if err == nil {
			_, err = fmt.Sscanf(out, "backend: %s %d service ports", &backend, &ports)
		}
		if err == nil && ports > n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent programmed %d service ports (%v), want %d", ports, err, n+1)
		}
		time.Sleep(2 * time.Second)
	}
	if peak := rss(fmt.Sprintf("%d Services, synced", n)); peak >= limit {
		t.Errorf("peak RSS %d MiB at %d Services; the DaemonSet's memory limit is %d MiB", peak>>20, n, limit>>20)
	}
}

// createScaleService creates Service mem-<i> with one EndpointSlice of 10
// ready endpoints (addresses in 10.200.0.0/15, unique per Service).
func createScaleService(ctx context.Context, c *netns.Cluster, i int) error {
	name := fmt.Sprintf("mem-%d", i)
	if _, err := c.Client.CoreV1().Services("default").Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	port, proto, pn, ready := int32(8080), v1.ProtocolTCP, "", true
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &port, Protocol: &proto}}}
	for j := range 10 {
		k := i*10 + j
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 200+k>>16, k>>8&255, k&255)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	_, err := c.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
	return err
}

// daemonSetMemoryLimit is the agent container's memory limit in
// deploy/base.
func daemonSetMemoryLimit(t *testing.T) int64 {
	objs, err := cluster.DeployObjects()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			if l := ds.Spec.Template.Spec.Containers[0].Resources.Limits.Memory(); !l.IsZero() {
				return l.Value()
			}
		}
	}
	t.Fatal("deploy/base's DaemonSet has no memory limit")
	return 0
}
