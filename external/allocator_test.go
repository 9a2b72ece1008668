package external

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// A Service whose address a pool change left outside every pool keeps it,
// is told so once (not at every resync, nor at the next pool change), and
// a new Service gets an address of the pool as it is now.
func TestAllocatorKeepsAddressOutsidePools(t *testing.T) {
	ctx := context.Background()
	cfg, err := Config{Pools: []PoolConfig{{Name: "p", Addresses: []string{"192.0.2.0/30"}}}}.parse() // .1 and .2
	if err != nil {
		t.Fatal(err)
	}
	web := lbService("web", false, "192.0.2.5") // from the pool's /29 of before
	client := fake.NewClientset(web)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(web); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(10)
	term := func() *allocator {
		t.Helper()
		a, err := newAllocator(cfg, client, corelisters.NewServiceLister(idx), rec, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.rebuild(); err != nil {
			t.Fatal(err)
		}
		return a
	}
	sync := func(a *allocator, name string) {
		t.Helper()
		if err := a.sync(ctx, keyOf(lbService(name, false))); err != nil {
			t.Fatal(err)
		}
	}
	a := term()
	sync(a, "web")
	sync(a, "web") // a resync
	b := term()    // the pools change again
	b.inherit(a)
	sync(b, "web")

	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "Warning IPOutsidePools load-balancer IPs [192.0.2.5] are outside every address pool now") {
		t.Errorf("events %q, want one IPOutsidePools warning", events)
	}
	got, err := client.CoreV1().Services("ns").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ips := statusIPs(got); len(ips) != 1 || ips[0].String() != "192.0.2.5" {
		t.Errorf("web's status %v, want it kept at 192.0.2.5", ips)
	}

	// A new Service gets the pool's first address, not web's.
	n := lbService("new", false)
	if _, err := client.CoreV1().Services("ns").Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := idx.Add(n); err != nil {
		t.Fatal(err)
	}
	sync(b, "new")
	got, err = client.CoreV1().Services("ns").Get(ctx, "new", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, ip := range statusIPs(got) {
		ips = append(ips, ip.String())
	}
	if !slices.Equal(ips, []string{"192.0.2.1"}) {
		t.Errorf("new got %v, want 192.0.2.1 of the pool now", ips)
	}
}
