package pressure

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestWatchHistoryCompacted: node 1's agent loses its connection to the
// API server (its proxy stops listening: every attempt is refused, so its
// reflectors keep retrying their watches from where they were). Meanwhile
// a Service is created, one moves its endpoint to another pod and one is
// deleted; a hundred more writes follow and etcd is compacted at the last
// one. When the agent reconnects, every watch from before the compaction
// is answered as kube-apiserver answers it once the version has left its
// watch cache: an ERROR event with 410 Expired. (Here the proxy answers so:
// the API server's own cache still holds that history, compaction or not,
// and would serve the watch.) The agent must list again
// without dropping what it serves (a pod's request loop to an untouched
// Service sees no failure), serve the three changes, and take them as
// changes, not rewrite its whole ruleset.
func TestWatchHistoryCompacted(t *testing.T) {
	x := newProxied(t)
	c, proxy, client, backends := x.c, x.proxy, x.client, x.backends
	ctx := ctxFor(t)

	steady := expose(t, c, "steady", v1.ServiceTypeClusterIP, backends)
	moved := expose(t, c, "moved", v1.ServiceTypeClusterIP, backends[:1])
	gone := expose(t, c, "gone", v1.ServiceTypeClusterIP, backends)
	for _, s := range []struct {
		svc  *v1.Service
		pods []*netns.Pod
	}{{steady, backends}, {moved, backends[:1]}, {gone, backends}} {
		waitServed(ctx, t, client.Netns, clusterIP(s.svc), s.pods, time.Now(), netns.ConvergeTimeout)
	}
	before := x.agent.metrics(t)
	loop := startLoop(client.Netns, clusterIP(steady), backends, 100*time.Millisecond)

	broke := time.Now()
	proxy.down()
	added := expose(t, c, "added", v1.ServiceTypeClusterIP, backends)
	if err := c.SetEndpoints(ctx, moved, netns.Ready(backends[1:]...)); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteService(ctx, gone.Namespace, gone.Name); err != nil {
		t.Fatal(err)
	}
	rv := churn(ctx, t, c, 100)
	compactEtcd(ctx, t, c, rv)
	proxy.compact(rv)
	t.Logf("etcd compacted at revision %d; watches from before it get 410 Expired", rv)
	time.Sleep(time.Until(broke.Add(10 * time.Second)))
	proxy.up(t)
	back := time.Now()

	// A reflector waits out its back-off (grown while refused) before the
	// expired watch and again before listing.
	bound := netns.ConvergeTimeout + reflectorMaxBackoff
	d := waitServed(ctx, t, client.Netns, clusterIP(added), backends, back, bound)
	t.Logf("Service created while the watch was broken: served %v after the API server was back (bound %v)", d.Round(time.Millisecond), bound)
	d, err := netns.WaitBackends(ctx, client.Netns, "tcp", clusterIP(moved), backends[1:], back)
	if err != nil {
		t.Fatalf("endpoint moved while the watch was broken: %v", err)
	}
	t.Logf("endpoint moved while the watch was broken: followed %v after", d.Round(time.Millisecond))
	d, err = netns.WaitUnserved(ctx, client.Netns, "tcp", clusterIP(gone), back)
	if err != nil {
		t.Fatalf("Service deleted while the watch was broken: %v", err)
	}
	t.Logf("Service deleted while the watch was broken: unserved %v after", d.Round(time.Millisecond))
	checkLoop(t, "requests to an untouched Service through the broken watch and the relist", loop)
	x.agent.onlyChangesSynced(t, before, "the break")

	// What the agent asked once back: each expired watch, then a listing.
	// The watches of Services and EndpointSlices had carried events, so
	// their reflectors retry them from their last version: the 410 case.
	// (A watch that saw nothing may be dropped for a listing at once.)
	var expired, listings []string
	for _, r := range proxy.requests(back, time.Now()) {
		switch {
		case r.Code == http.StatusGone:
			expired = append(expired, r.Path+"?resourceVersion="+r.RV)
		case r.Initial || (!r.Watch && r.Method == http.MethodGet):
			listings = append(listings, r.Path+"?resourceVersion="+r.RV)
		}
	}
	t.Logf("after the break: %d watches answered 410 Expired %v; %d listings %v", len(expired), expired, len(listings), listings)
	for _, res := range []string{"/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"} {
		if !hasPath(expired, res) {
			t.Errorf("no watch of %s from before the compaction reached the proxy: the case did not happen", res)
		}
		if !hasPath(listings, res) {
			t.Errorf("%s was not listed again after its watch expired", res)
		}
	}
}

func hasPath(reqs []string, path string) bool {
	for _, r := range reqs {
		if strings.HasPrefix(r, path+"?") {
			return true
		}
	}
	return false
}

// churn writes a ConfigMap n times (each write a new etcd revision) and
// returns the resource version of the last write.
func churn(ctx context.Context, t *testing.T, c *netns.Cluster, n int) int64 {
	t.Helper()
	cms := c.Client.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	cm, err := cms.Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "churn"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cms.Delete(context.Background(), cm.Name, metav1.DeleteOptions{}) })
	for i := range n {
		cm.Data = map[string]string{"write": strconv.Itoa(i)}
		if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rv, err := strconv.ParseInt(cm.ResourceVersion, 10, 64)
	if err != nil {
		t.Fatalf("resource version %q: %v", cm.ResourceVersion, err)
	}
	return rv
}

// compactEtcd compacts etcd's history up to revision rv, as kube-apiserver's
// own compactor does every few minutes, through etcd's JSON gateway on the
// control plane's loopback.
func compactEtcd(ctx context.Context, t *testing.T, c *netns.Cluster, rv int64) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: nsutil.Dialer(c.ControlNS)}}
	body := fmt.Sprintf(`{"revision":"%d","physical":true}`, rv)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:2379/v3/kv/compaction", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("compact etcd: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("compact etcd at %d: %s: %s", rv, resp.Status, b)
	}
}
