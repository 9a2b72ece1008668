package pressure

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// reflectorMaxBackoff is the longest client-go's reflectors wait between
// two attempts: their back-off is capped at 30 s and jittered by up to as
// much again.
const reflectorMaxBackoff = 60 * time.Second

// TestAPIServerRefusesForMinutes: node 1's agent reaches kube-apiserver
// through a proxy that, for the outage (two minutes, or
// $ONEHOP_PRESSURE_OUTAGE), answers every request with 429 and Retry-After:
// 1 for its first half and with 503 for its second, after cutting every
// watch the agent had open. A pod on node 1 sends a request to a Service
// every 100 ms throughout: none may fail, since the kernel keeps what the
// agent programmed. A Service created during the outage is served once the
// API server answers again, within the reflectors' longest back-off on top
// of netns.ConvergeTimeout, and the agent takes it as a change: no full
// sync. The requests the agent made during the outage are reported per
// minute (its back-off), not judged.
func TestAPIServerRefusesForMinutes(t *testing.T) {
	long := outage(t)
	x := newProxied(t)
	c, proxy, client, backends := x.c, x.proxy, x.client, x.backends
	ctx := ctxFor(t)

	steady := expose(t, c, "steady", v1.ServiceTypeClusterIP, backends)
	waitServed(ctx, t, client.Netns, clusterIP(steady), backends, time.Now(), netns.ConvergeTimeout)
	before := x.agent.metrics(t)
	loop := startLoop(client.Netns, clusterIP(steady), backends, 100*time.Millisecond)

	began := time.Now()
	proxy.refuse(http.StatusTooManyRequests)
	proxy.cut()
	t.Logf("outage of %v begins: 429 (Retry-After: 1) to every request for %v, then 503", long, long/2)
	added := expose(t, c, "added", v1.ServiceTypeClusterIP, backends)
	time.Sleep(time.Until(began.Add(long / 2)))
	proxy.refuse(http.StatusServiceUnavailable)
	time.Sleep(time.Until(began.Add(long)))
	// The agent was cut off: the Service made meanwhile is not served.
	if rep, err := nsutil.Request(ctx, client.Netns, "tcp", clusterIP(added)); err == nil {
		t.Fatalf("%s (created during the outage) answered by %s before the outage ended: the proxy did not cut the agent off", clusterIP(added), rep.Name)
	}
	proxy.refuse(0)
	ended := time.Now()

	bound := netns.ConvergeTimeout + reflectorMaxBackoff
	d := waitServed(ctx, t, client.Netns, clusterIP(added), backends, ended, bound)
	t.Logf("the Service created during the outage was served %v after it ended (bound %v)", d.Round(time.Millisecond), bound)
	checkLoop(t, "requests to a Service through the outage", loop)
	x.agent.onlyChangesSynced(t, before, "the outage")

	seen := proxy.requests(began, ended)
	refused := 0
	for _, r := range seen {
		if r.Code != 0 {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("the agent made no request during the outage: the proxy was not in its path")
	}
	t.Logf("requests the agent made during the %v outage: %d\n%s", long, len(seen), perMinute(seen, began, ended))
}

// perMinute tells how many requests came in each minute from began to
// ended, each with the statuses the proxy answered, and the busiest
// request paths.
func perMinute(reqs []apiRequest, began, ended time.Time) string {
	type bucket struct {
		n     int
		codes map[int]int
	}
	var buckets []bucket
	paths := map[string]int{}
	for m := began; m.Before(ended); m = m.Add(time.Minute) {
		buckets = append(buckets, bucket{codes: map[int]int{}})
	}
	for _, r := range reqs {
		i := int(r.At.Sub(began) / time.Minute)
		buckets[i].n++
		buckets[i].codes[r.Code]++
		kind := r.Method + " " + r.Path
		if r.Watch {
			kind += " (watch)"
		}
		paths[kind]++
	}
	var b strings.Builder
	tens := make([]int, int(ended.Sub(began)/(10*time.Second))+1)
	for _, r := range reqs {
		tens[int(r.At.Sub(began)/(10*time.Second))]++
	}
	fmt.Fprintf(&b, "  per 10 s: %v\n", tens)
	for i, bk := range buckets {
		length := min(time.Minute, ended.Sub(began.Add(time.Duration(i)*time.Minute)))
		fmt.Fprintf(&b, "  minute %d (%v): %d requests, by answer %v\n", i+1, length.Round(time.Second), bk.n, bk.codes)
	}
	var kinds []string
	for k := range paths {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return paths[kinds[i]] > paths[kinds[j]] })
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %5d  %s\n", paths[k], k)
	}
	return b.String()
}
