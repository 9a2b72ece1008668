package ipvs

import (
	"context"
	"strings"
	"testing"
)

// TestSchedulers: every scheduler is accepted by the kernel, shows in the
// dump and carries traffic; sh keeps one client on one pod.
func TestSchedulers(t *testing.T) {
	n := newTestNet(t, 2)
	for _, sched := range []string{"rr", "wrr", "lc", "wlc", "sh", "mh"} {
		b := n.backend(testCfg, WithScheduler(sched))
		b.sync(true, web(1, 2))
		if d := b.dump(); !strings.Contains(d.Raw, "TCP "+vip+":80 "+sched+" ") {
			t.Errorf("%s: kernel has\n%s", sched, d.Raw)
		}
		seen := map[string]int{}
		for range 4 {
			pod, _ := n.get(t, n.client, vip+":80")
			seen[pod]++
		}
		t.Logf("%s: %v", sched, seen)
		switch sched {
		case "rr", "wrr":
			if len(seen) != 2 {
				t.Errorf("%s: want both pods, got %v", sched, seen)
			}
		case "sh", "mh":
			if len(seen) != 1 {
				t.Errorf("%s: one client must stay on one pod, got %v", sched, seen)
			}
		}
		if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAffinity: ClientIP affinity is IPVS persistence with the timeout.
func TestAffinity(t *testing.T) {
	n := newTestNet(t, 2)
	b := n.backend(testCfg)
	s := web(1, 2)
	s.Portals[0].Affinity.TimeoutSeconds = 60
	b.sync(true, s)
	seen := map[string]int{}
	for range 5 {
		pod, _ := n.get(t, n.client, vip+":80")
		seen[pod]++
	}
	if len(seen) != 1 {
		t.Errorf("affinity: one client reached %v", seen)
	}
	if d := b.dump(); !strings.Contains(d.Raw, "persistent 60") {
		t.Errorf("no persistence in\n%s", d.Raw)
	}
}
