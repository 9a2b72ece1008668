package ipvs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestHashingDrain: under the hashing schedulers (sh, mh) a client whose
// pod is draining (weight 0, a connection still open) reaches another pod
// with its next connection instead of being refused: sh keeps a draining
// destination's share of its hash table, and without the fallback flag
// refuses the clients it hashes there.
func TestHashingDrain(t *testing.T) {
	n := newTestNet(t, 3)
	for _, sched := range []string{"sh", "mh"} {
		b := n.backend(testCfg, WithScheduler(sched))
		b.sync(true, web(1, 2, 3))
		if d := b.dump(); !strings.Contains(d.Raw, sched+" fallback") {
			t.Errorf("%s: no fallback flag:\n%s", sched, d.Raw)
		}
		c, err := n.dial(n.client, vip+":80")
		if err != nil {
			t.Fatalf("%s: %v", sched, err)
		}
		var rest []int
		for i := 1; i <= 3; i++ {
			if fmt.Sprintf("pod-%d", i) != c.Pod {
				rest = append(rest, i)
			}
		}
		b.sync(false, web(rest...)) // c.Pod drains: c keeps it at weight 0
		for range 3 {
			nc, err := n.dial(n.client, vip+":80")
			if err != nil {
				t.Errorf("%s: a new connection while %s drains: %v", sched, c.Pod, err)
				break
			}
			nc.Close()
			if nc.Pod == c.Pod {
				t.Errorf("%s: a new connection went to draining %s", sched, c.Pod)
			}
		}
		if err := c.echo(); err != nil {
			t.Errorf("%s: the connection to the draining pod: %v", sched, err)
		}
		c.Close()
		if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEndpointChange: removing an endpoint keeps its established
// connection working (weight 0), sends new connections elsewhere, and the
// destination is deleted once drained (bounded by the drain timeout).
func TestEndpointChange(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg, WithDrainTimeout(2*time.Second))
	b.sync(true, web(1, 2))
	var old *conn
	var others []*conn
	for range 4 {
		c, err := n.dial(n.client, vip+":80")
		if err != nil {
			t.Fatal(err)
		}
		if c.Pod == "pod-1" && old == nil {
			old = c
		} else {
			others = append(others, c)
		}
	}
	for _, c := range others {
		c.Close()
	}
	if old == nil {
		t.Fatal("no connection reached pod-1")
	}
	defer old.Close()

	b.sync(false, web(2))
	if err := old.echo(); err != nil {
		t.Errorf("established connection to the removed endpoint broke: %v", err)
	}
	for range 3 {
		if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-2" {
			t.Errorf("new connection went to removed %s", pod)
		}
	}
	if dr := b.b.Draining(); len(dr) != 1 || !strings.Contains(dr[0], podIP(1)) {
		t.Errorf("draining: %v", dr)
	}
	if d := b.dump(); !strings.Contains(d.Raw, podIP(1)+":8080 Masq 0 active=1") {
		t.Errorf("removed endpoint not at weight 0 with its connection:\n%s", d.Raw)
	}
	// Back again before it drained: weight 1, not draining.
	b.sync(false, web(1, 2))
	if dr := b.b.Draining(); len(dr) != 0 {
		t.Errorf("re-added endpoint still draining: %v", dr)
	}
	b.sync(false, web(2))
	old.Close()
	time.Sleep(2500 * time.Millisecond)
	if err := b.do(func(b *Backend) error { return b.Check(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	if dr := b.b.Draining(); len(dr) != 0 {
		t.Errorf("still draining after the timeout: %v", dr)
	}
	if d := b.dump(); strings.Contains(d.Raw, podIP(1)) {
		t.Errorf("drained endpoint still in the kernel:\n%s", d.Raw)
	}
}
