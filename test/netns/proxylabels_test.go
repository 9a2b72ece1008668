package netns_test

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/netns"
)

// The labels a proxy selects by, changed on live objects, as upstream's
// "should implement service.kubernetes.io/headless" does: a slice labelled
// headless, and a Service (with its slices, as the EndpointSlice controller
// mirrors them) labelled for another proxy, stop being served from a pod
// and from the node itself; without the label they are served again. A
// Service with a cluster IP labelled headless is served, as by kube-proxy.
func testProxyLabels(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pods := c.Pods()
	svc, since := expose(t, c, service("labelled", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), pods)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	froms := []string{c.Nodes[1].Pods[0].Netns, c.Nodes[0].Netns}
	for _, from := range froms {
		if _, err := netns.WaitBackends(ctx, from, "tcp", addr, pods, since); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		what           string
		service, slice map[string]string // labels set (value) or removed (absent key in the other steps)
		served         bool
	}{
		{"slice labelled headless", nil, map[string]string{portal.LabelHeadless: ""}, false},
		{"headless label removed", nil, nil, true},
		{"labelled for another proxy", map[string]string{portal.LabelServiceProxyName: "someone-else"}, map[string]string{portal.LabelServiceProxyName: "someone-else"}, false},
		// As kube-proxy: the headless label selects slices only (the
		// EndpointSlice controller never copies it onto the slices of a
		// Service with a cluster IP).
		{"proxy label removed, the Service labelled headless", map[string]string{portal.LabelHeadless: ""}, nil, true},
		{"Service's headless label removed", nil, nil, true},
	}
	for _, st := range steps {
		since := time.Now()
		relabelService(ctx, t, c, svc, st.service)
		relabelSlices(ctx, t, c, svc, st.slice)
		for _, from := range froms {
			var d time.Duration
			var err error
			if st.served {
				d, err = netns.WaitBackends(ctx, from, "tcp", addr, pods, since)
			} else {
				d, err = netns.WaitUnserved(ctx, from, "tcp", addr, since)
			}
			if err != nil {
				t.Fatalf("%s: %v", st.what, err)
			}
			lat.add(t, st.what, d)
		}
	}
}

// proxyLabels are the labels relabel* set or clear.
var proxyLabels = []string{portal.LabelHeadless, portal.LabelServiceProxyName}

func withProxyLabels(have, set map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range have {
		out[k] = v
	}
	for _, k := range proxyLabels {
		delete(out, k)
	}
	for k, v := range set {
		out[k] = v
	}
	return out
}

func relabelService(ctx context.Context, t *testing.T, c *netns.Cluster, svc *v1.Service, set map[string]string) {
	t.Helper()
	s, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Labels = withProxyLabels(s.Labels, set)
	if _, err := c.Client.CoreV1().Services(svc.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func relabelSlices(ctx context.Context, t *testing.T, c *netns.Cluster, svc *v1.Service, set map[string]string) {
	t.Helper()
	api := c.Client.DiscoveryV1().EndpointSlices(svc.Namespace)
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		t.Fatalf("no EndpointSlice of %s", svc.Name)
	}
	for i := range list.Items {
		s := &list.Items[i]
		s.Labels = withProxyLabels(s.Labels, set)
		if _, err := api.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
