package netns_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/netns"
)

// TestE2E runs every end-to-end case against one namespace cluster (two
// nodes, two pods each, real kube-apiserver, real agents). The cases run in
// order; the agent-restart case runs last since it disturbs a node.
func TestE2E(t *testing.T) {
	began := time.Now()
	c := netns.NewForTest(t, netns.Config{})
	t.Logf("cluster %s up in %v", c.ID, time.Since(began).Round(time.Millisecond))
	lat := &latencies{}
	t.Cleanup(func() { lat.log(t) })

	cases := []struct {
		name string
		run  func(*testing.T, *netns.Cluster, *latencies)
	}{
		{"KubernetesServiceFromPod", testKubernetesServiceFromPod},
		{"ClusterIPFromPod", testClusterIPFromPod},
		{"MultiPort", testMultiPort},
		{"SamePortTCPAndUDP", testSamePortTCPAndUDP},
		{"DualStackClusterIP", testDualStack},
		{"NodePortFromClient", testNodePortFromClient},
		{"ExternalIPFromClient", testExternalIPFromClient},
		{"LoadBalancerIngressFromClient", testLoadBalancerIngress},
		{"LoadBalancerLocalKeepsClientIP", testLoadBalancerLocal},
		{"DeleteStopsRecreateRestores", testDeleteRecreate},
		{"EndpointAddedRemoved", testEndpointChanges},
		{"ProxyLabels", testProxyLabels},
		{"AgentTraceMatchesTraffic", testAgentTrace},
		{"AgentRestartUnderLoad", testAgentRestart},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c, lat) })
	}
	t.Logf("cluster start-up and every case took %v", time.Since(began).Round(time.Millisecond))
}

// latencies collects programming latencies (API change -> traffic
// following) for a summary at the end.
type latencies struct {
	mu   sync.Mutex
	rows []string
}

func (l *latencies) add(t *testing.T, what string, d time.Duration) {
	t.Helper()
	t.Logf("programming latency %s: %v", what, d.Round(time.Millisecond))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rows = append(l.rows, fmt.Sprintf("%-60s %8v", t.Name()+": "+what, d.Round(time.Millisecond)))
}

func (l *latencies) log(t *testing.T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := "programming latency (API write returned -> every expected endpoint answered, within a steady streak of correct answers):\n"
	for _, r := range l.rows {
		s += "  " + r + "\n"
	}
	t.Log(s)
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func port(name string, proto v1.Protocol, port, target int) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: proto, Port: int32(port), TargetPort: intstr.FromInt32(int32(target))}
}

func service(name string, typ v1.ServiceType, ports ...v1.ServicePort) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: v1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": name},
			Ports:    ports,
		},
	}
}

// expose creates svc with ready endpoints on pods and returns it with the
// time the last API write returned.
func expose(t *testing.T, c *netns.Cluster, svc *v1.Service, pods []*netns.Pod) (*v1.Service, time.Time) {
	t.Helper()
	ctx := ctxFor(t)
	created, err := c.CreateService(ctx, svc)
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	if err := c.SetEndpoints(ctx, created, netns.Ready(pods...)); err != nil {
		t.Fatalf("endpoints of %s: %v", svc.Name, err)
	}
	t.Cleanup(func() {
		if err := c.DeleteService(context.Background(), created.Namespace, created.Name); err != nil {
			t.Logf("delete service %s: %v", created.Name, err)
		}
	})
	t.Cleanup(func() { // runs first: the state while the service still exists
		if t.Failed() {
			c.LogState(t)
		}
	})
	return created, time.Now()
}

func hostPort(ip string, p int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(p))) }
