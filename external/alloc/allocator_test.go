package alloc

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/internal/hooktest"
)

// A Service whose address a pool change left outside every pool keeps it,
// is told so once (not at every resync, nor at the next pool change), and
// a new Service gets an address of the pool as it is now.
func TestAllocatorKeepsAddressOutsidePools(t *testing.T) {
	ctx := context.Background()
	cfg, err := config.Config{Pools: []config.PoolConfig{{Name: "p", Addresses: []string{"192.0.2.0/30"}}}}.Parse() // .1 and .2
	if err != nil {
		t.Fatal(err)
	}
	web := hooktest.LBService("web", false, "192.0.2.5") // from the pool's /29 of before
	client := fake.NewClientset(web)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(web); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(10)
	term := func() *Allocator {
		t.Helper()
		a, err := New(cfg, client, corelisters.NewServiceLister(idx), rec, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Rebuild(); err != nil {
			t.Fatal(err)
		}
		return a
	}
	sync := func(a *Allocator, name string) {
		t.Helper()
		if err := a.sync(ctx, KeyOf(hooktest.LBService(name, false))); err != nil {
			t.Fatal(err)
		}
	}
	a := term()
	sync(a, "web")
	sync(a, "web") // a resync
	b := term()    // the pools change again
	b.Inherit(a)
	sync(b, "web")

	events := hooktest.Drain(rec)
	if len(events) != 1 || !strings.HasPrefix(events[0], "Warning IPOutsidePools load-balancer IPs [192.0.2.5] are outside every address pool now") {
		t.Errorf("events %q, want one IPOutsidePools warning", events)
	}
	got, err := client.CoreV1().Services("ns").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ips := StatusIPs(got); len(ips) != 1 || ips[0].String() != "192.0.2.5" {
		t.Errorf("web's status %v, want it kept at 192.0.2.5", ips)
	}

	// A new Service gets the pool's first address, not web's.
	n := hooktest.LBService("new", false)
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
	for _, ip := range StatusIPs(got) {
		ips = append(ips, ip.String())
	}
	if !slices.Equal(ips, []string{"192.0.2.1"}) {
		t.Errorf("new got %v, want 192.0.2.1 of the pool now", ips)
	}
}

// A Service being deleted (a finalizer holds it) keeps its address, across
// a new term too, while every node still serves it: another Service
// requesting that address is refused until the first is gone, then gets it.
func TestAllocatorTerminatingServiceKeepsItsAddress(t *testing.T) {
	ctx := context.Background()
	now := metav1.Now()
	web := hooktest.LBService("web", false, "192.0.2.1")
	web.DeletionTimestamp, web.Finalizers = &now, []string{"example.com/hold"}
	taker := hooktest.LBService("taker", false)
	taker.Annotations = map[string]string{AnnotationLoadBalancerIPs: "192.0.2.1"}
	a, client, idx, rec := testAllocator(t, "192.0.2.0/30", web, taker) // .1 and .2
	// A new term finds web terminating.
	if err := a.Rebuild(); err != nil {
		t.Fatal(err)
	}
	sync := func(name string) {
		t.Helper()
		if err := a.sync(ctx, KeyOf(hooktest.LBService(name, false))); err != nil {
			t.Fatal(err)
		}
	}
	status := func(name string) []string {
		t.Helper()
		got, err := client.CoreV1().Services("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, ip := range StatusIPs(got) {
			ips = append(ips, ip.String())
		}
		return ips
	}
	sync("web")
	sync("taker")
	if ips := a.alloc.Holds(KeyOf(web)); len(ips) != 1 || ips[0].String() != "192.0.2.1" {
		t.Errorf("terminating web holds %v, want 192.0.2.1", ips)
	}
	if ips := status("taker"); len(ips) != 0 {
		t.Errorf("taker got %v while web, terminating, still exists", ips)
	}
	if events := hooktest.Drain(rec); len(events) != 1 || !strings.HasPrefix(events[0], "Warning IPConflict 192.0.2.1 is already used by") {
		t.Errorf("events %q, want one IPConflict warning on taker", events)
	}

	// web is gone: its address goes to taker.
	if err := idx.Delete(web); err != nil {
		t.Fatal(err)
	}
	sync("web")
	sync("taker")
	if ips := status("taker"); !slices.Equal(ips, []string{"192.0.2.1"}) {
		t.Errorf("taker got %v once web was gone, want 192.0.2.1", ips)
	}
}

// testAllocator is an allocator of one pool of addresses over the Services
// svcs, in a fake client and in the lister's index, with its events'
// recorder.
func testAllocator(t *testing.T, addresses string, svcs ...*corev1.Service) (*Allocator, *fake.Clientset, cache.Indexer, *record.FakeRecorder) {
	t.Helper()
	cfg, err := config.Config{Pools: []config.PoolConfig{{Name: "p", Addresses: []string{addresses}}}}.Parse()
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, s := range svcs {
		objs = append(objs, s)
		if err := idx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	client := fake.NewClientset(objs...)
	rec := record.NewFakeRecorder(10)
	a, err := New(cfg, client, corelisters.NewServiceLister(idx), rec, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return a, client, idx, rec
}
