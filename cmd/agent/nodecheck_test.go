package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/onehop/onehop/portal"
)

// lockedBuffer is a log sink safe for the checker's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testNode(name string, labels map[string]string, addrs ...v1.NodeAddress) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Status: v1.NodeStatus{Addresses: addrs}}
}

func TestNodeNameHints(t *testing.T) {
	nodes := []v1.Node{
		*testNode("node1", nil), *testNode("node2.example.com", nil),
		*testNode("worker-a", map[string]string{v1.LabelHostname: "host-a.lan"}),
		*testNode("worker-b", nil, v1.NodeAddress{Type: v1.NodeHostName, Address: "HOST-B"},
			v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.0.0.1"}),
	}
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"node1.example.com", []string{"node1"}},
		{"node2", []string{"node2.example.com"}},
		{"host-a.lan", []string{"worker-a"}},
		{"host-b", []string{"worker-b"}},
		{"10.0.0.1", nil},
		{"node3", nil},
	} {
		if got := nodeNameHints(tc.name, nodes); !slices.Equal(got, tc.want) {
			t.Errorf("hints for %s = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A wrong --hostname-override (an FQDN for the Node's short name) is an
// error in the log, naming the Node meant, again and again while the Node
// is missing; onehop_node_found follows.
func TestNodeCheckWrongName(t *testing.T) {
	client := fake.NewSimpleClientset(testNode("node1", nil), testNode("node2", nil))
	var logs lockedBuffer
	reg := prometheus.NewRegistry()
	c := newNodeCheck("node1.example.com", client, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	c.every = time.Millisecond
	var node atomic.Pointer[v1.Node]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.run(ctx, node.Load) }()
	defer func() { cancel(); <-done }()

	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s; log:\n%s", what, logs.String())
			}
		}
	}
	waitUntil("two error lines", func() bool { return strings.Count(logs.String(), "level=ERROR") >= 2 })
	line, _, _ := strings.Cut(logs.String(), "\n")
	for _, want := range []string{"level=ERROR", "node=node1.example.com", "did_you_mean=node1", "--hostname-override"} {
		if !strings.Contains(line, want) {
			t.Errorf("log line lacks %q: %s", want, line)
		}
	}
	if v := testutil.ToFloat64(c.found); v != 0 {
		t.Errorf("onehop_node_found = %v while missing", v)
	}
	node.Store(testNode("node1.example.com", nil))
	waitUntil("onehop_node_found 1", func() bool { return testutil.ToFloat64(c.found) == 1 })
	waitUntil("a line saying it is there", func() bool { return strings.Contains(logs.String(), "Node object is there now") })
	if n, err := testutil.GatherAndCount(reg, "onehop_node_found"); err != nil || n != 1 {
		t.Errorf("onehop_node_found registered %d times, err %v", n, err)
	}
}

// detectLocalMode NodeCIDR waits for the Node's podCIDRs.
func TestWaitForPodCIDRs(t *testing.T) {
	n := testNode("node1", nil)
	n.Spec.PodCIDRs = []string{"10.244.1.0/24", "fd00:10:244:1::/64"}
	c := newNodeCheck("node1", fake.NewSimpleClientset(n), slog.New(slog.DiscardHandler), nil)
	got, err := c.waitForPodCIDRs(context.Background())
	want := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("podCIDRs %v, err %v; want %v", got, err, want)
	}
	if err := podCIDRsChanged(n, want); err != nil {
		t.Errorf("unchanged: %v", err)
	}
	n2 := n.DeepCopy()
	n2.Spec.PodCIDRs = []string{"10.244.9.0/24"}
	if err := podCIDRsChanged(n2, want); err == nil || !strings.Contains(err.Error(), "10.244.9.0/24") {
		t.Errorf("changed: err %v", err)
	}

	// A Node that never shows up: the wait ends with the context, after
	// saying what is missing.
	var logs lockedBuffer
	c = newNodeCheck("node1.example.com", fake.NewSimpleClientset(n), slog.New(slog.NewTextHandler(&logs, nil)), nil)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for !strings.Contains(logs.String(), "did_you_mean=node1") {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err := c.waitForPodCIDRs(ctx); err == nil {
		t.Error("wait for a missing Node ended without an error")
	}
}

// staticSource hands out the same snapshot every time, as a model that
// does not change.
type staticSource struct {
	addrs []netip.Addr
	svcs  map[portal.ServiceKey]*portal.Service
}

func (s staticSource) Snapshot() (*portal.Snapshot, []time.Time) {
	snap := &portal.Snapshot{Node: portal.Node{Name: "n", NodePortAddrs: s.addrs}, Services: s.svcs}
	for k := range s.svcs {
		snap.Dirty = append(snap.Dirty, k)
	}
	return snap, nil
}

// With CIDRs, NodePorts follow the node's interface addresses inside them,
// not the Node object's addresses.
func TestNodePortSource(t *testing.T) {
	src := newNodePortSource(staticSource{addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
		[]netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("::/0")})
	local := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("192.168.3.4"),
		netip.MustParseAddr("192.169.0.1"), netip.MustParseAddr("2001:db8::5")}
	if !src.setLocal(local) {
		t.Error("first addresses: no change reported")
	}
	if src.setLocal(local) {
		t.Error("same addresses: change reported")
	}
	snap, _ := src.Snapshot()
	want := []netip.Addr{netip.MustParseAddr("192.168.3.4"), netip.MustParseAddr("2001:db8::5")}
	if !slices.Equal(snap.Node.NodePortAddrs, want) {
		t.Errorf("NodePort addresses %v, want %v", snap.Node.NodePortAddrs, want)
	}
}
