package semantics_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// waitClientSource polls until need answers in a row through addr saw the
// external client's own address, and fails otherwise.
func waitClientSource(t *testing.T, c *netns.Cluster, addr string, want []*netns.Pod, need int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxFor(t), netns.ConvergeTimeout)
	defer cancel()
	allowed := map[string]bool{}
	for _, p := range want {
		allowed[p.Name] = true
	}
	began := time.Now()
	streak, last := 0, ""
	for streak < need {
		rep, err := nsutil.Request(ctx, c.ClientNetns, "tcp", addr)
		switch {
		case err != nil:
			streak, last = 0, err.Error()
		case !allowed[rep.Name]:
			streak, last = 0, "answered by "+rep.Name+", not a local endpoint"
		case rep.SourceIP() != netns.ClientIP().String():
			streak, last = 0, fmt.Sprintf("%s saw source %s, not the client's %s", rep.Name, rep.SourceIP(), netns.ClientIP())
		default:
			streak++
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: no %d answers in a row from %v seeing the client's address within %v; last: %s",
				addr, need, podNames(want), netns.ConvergeTimeout, last)
		}
	}
	return time.Since(began)
}

// externalTrafficPolicy Local: the client's address reaches the pod, a node
// without local endpoints drops, and the health-check node port tells load
// balancers which node to use.
func testExternalLocal(t *testing.T, c *netns.Cluster) {
	node1, node2 := c.Nodes[0], c.Nodes[1]
	svc, since := expose(t, c, service("local", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), netns.Ready(node1.Pods...))
	np := svc.Spec.Ports[0].NodePort
	// Cluster policy first: node 2 forwards to node 1's pods, so a later
	// silence on node 2 is the policy, not a NodePort node 2 never had.
	d, err := netns.WaitBackends(ctxFor(t), c.ClientNetns, "tcp", hostPort(node2.IP, np), node1.Pods, since)
	if err != nil {
		t.Fatalf("Cluster policy via node 2: %v", err)
	}
	logLatency(t, "Cluster policy NodePort via node without endpoints", d)

	switched := time.Now()
	svc = updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("the API server allocated no healthCheckNodePort for a Local LoadBalancer Service")
	}

	t.Run("SourceIPKept", func(t *testing.T) {
		d := waitClientSource(t, c, hostPort(node1.IP, np), node1.Pods, 20)
		logLatency(t, "Local: 20 answers in a row seeing the client's address (since polling began)", d)
		t.Logf("since the switch to Local: %v", time.Since(switched).Round(time.Millisecond))
	})
	t.Run("NoLocalEndpointDrops", func(t *testing.T) {
		addr := hostPort(node2.IP, np)
		d, err := netns.WaitUnserved(ctxFor(t), c.ClientNetns, "tcp", addr, switched)
		if err != nil {
			t.Fatalf("node without local endpoints: %v", err)
		}
		logLatency(t, "Local: node without local endpoints stops answering", d)
		_, err = nsutil.Request(ctxFor(t), c.ClientNetns, "tcp", addr)
		if err == nil || !isDrop(err) {
			t.Errorf("NodePort on a node without local endpoints: %v, want the connection dropped (timeout), as kube-proxy", err)
		}
	})
	t.Run("HealthCheckNodePort", func(t *testing.T) {
		polled := time.Now() // the previous subtests took a while since the switch
		ok := waitHealth(t, c, node1, hc, http.StatusOK, 2, polled)
		checkHealthAnswer(t, ok, svc, 2)
		bad := waitHealth(t, c, node2, hc, http.StatusServiceUnavailable, 0, polled)
		checkHealthAnswer(t, bad, svc, 0)

		// The endpoints move to node 2: the answers swap, and so does traffic.
		moved := time.Now()
		if err := c.SetEndpoints(ctxFor(t), svc, netns.Ready(node2.Pods...)); err != nil {
			t.Fatal(err)
		}
		checkHealthAnswer(t, waitHealth(t, c, node1, hc, http.StatusServiceUnavailable, 0, moved), svc, 0)
		checkHealthAnswer(t, waitHealth(t, c, node2, hc, http.StatusOK, 2, moved), svc, 2)
		d := waitClientSource(t, c, hostPort(node2.IP, np), node2.Pods, 10)
		logLatency(t, "endpoints moved: node 2 serves with the client's address", d)
		d, err := netns.WaitUnserved(ctxFor(t), c.ClientNetns, "tcp", hostPort(node1.IP, np), moved)
		if err != nil {
			t.Fatalf("node 1 after its endpoints left: %v", err)
		}
		logLatency(t, "endpoints moved: node 1 stops answering", d)

		// Back to Cluster: the health-check port goes away.
		updateService(t, c, svc, func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
			s.Spec.HealthCheckNodePort = 0
		})
		waitHealthGone(t, c, node2, hc)
	})
}
