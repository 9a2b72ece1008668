package netns_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestHealthCheckWithoutWayIn: the healthCheckNodePort of a LoadBalancer
// Service with externalTrafficPolicy: Local is served, as kube-proxy
// serves it, also while no family of the Service has a way in from
// outside: no node ports (allocateLoadBalancerNodePorts: false) and no
// address published yet, then only a Proxy-mode or hostname ingress. It
// counts the node's ready endpoints, and goes when the policy is Cluster.
func TestHealthCheckWithoutWayIn(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{Nodes: 1})
	ctx := ctxFor(t)
	node := c.Nodes[0]
	s := service("proxied", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	svc, _ := expose(t, c, s, node.Pods)
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 || svc.Spec.Ports[0].NodePort != 0 {
		t.Fatalf("healthCheckNodePort %d, node port %d: want one and none", hc, svc.Spec.Ports[0].NodePort)
	}
	url := fmt.Sprintf("http://%s/healthz", hostPort(node.IP, hc))
	pods := len(node.Pods)

	// No address published.
	waitHealthAt(ctx, t, c, url, http.StatusOK, pods)
	// A Proxy-mode ingress IP and a hostname: still no way in here.
	cur, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
		{IP: netns.ExternalIP(42).String(), IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
		{Hostname: "lb.example"},
	}
	if _, err := c.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.SetEndpoints(ctx, svc, netns.Ready(node.Pods[0])); err != nil {
		t.Fatal(err)
	}
	waitHealthAt(ctx, t, c, url, http.StatusOK, 1)
	if err := c.SetEndpoints(ctx, svc, nil); err != nil {
		t.Fatal(err)
	}
	waitHealthAt(ctx, t, c, url, http.StatusServiceUnavailable, 0)

	// The Cluster policy: no health check.
	updateSpec(ctx, t, c, svc, func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy, s.Spec.HealthCheckNodePort = v1.ServiceExternalTrafficPolicyCluster, 0
	})
	waitHealthAt(ctx, t, c, url, 0, 0)
}

// waitHealthAt polls url from the external client until it answers code
// with count local endpoints for the Service; code 0 waits for the port
// to refuse connections.
func waitHealthAt(ctx context.Context, t *testing.T, c *netns.Cluster, url string, code, count int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, netns.ConvergeTimeout)
	defer cancel()
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{DialContext: nsutil.Dialer(c.ClientNetns), DisableKeepAlives: true},
	}
	var last string
	for ctx.Err() == nil {
		got, n, err := getHealthAt(ctx, client, url)
		switch {
		case err != nil && code == 0:
			return
		case err != nil:
			last = err.Error()
		case got == code && n == count:
			return
		default:
			last = fmt.Sprintf("%d with %d local endpoints", got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: want %d with %d local endpoints within %v; last: %s", url, code, count, netns.ConvergeTimeout, last)
}

// getHealthAt returns the status and the localEndpoints of one answer.
func getHealthAt(ctx context.Context, client *http.Client, url string) (int, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	var body struct {
		LocalEndpoints int `json:"localEndpoints"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return 0, 0, fmt.Errorf("body %q: %w", b, err)
	}
	return resp.StatusCode, body.LocalEndpoints, nil
}
