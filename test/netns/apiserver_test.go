package netns_test

import (
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// The "kubernetes" Service, whose EndpointSlice kube-apiserver writes itself,
// carries a pod's API calls: 10.96.0.1:443 DNATs to the apiserver on the node
// segment, and TLS verifies (the serving certificate names 10.96.0.1).
func testKubernetesServiceFromPod(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	from := c.Nodes[1].Pods[0]
	cfg := c.CP.RESTConfig()
	cfg.Host = "https://10.96.0.1:443"
	cfg.Dial = nsutil.Dialer(from.Netns)
	cfg.Timeout = 2 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	deadline := began.Add(netns.ConvergeTimeout)
	for {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET https://10.96.0.1/readyz from pod %s: %q, %v", from.Name, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("pod %s reached kube-apiserver through the kubernetes Service %v after the first try", from.Name, time.Since(began).Round(time.Millisecond))
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("apiserver version via the Service: %s", v.GitVersion)
}
