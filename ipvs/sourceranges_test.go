package ipvs

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
)

// TestSourceRanges: loadBalancerSourceRanges let the client in or drop it.
func TestSourceRanges(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	lb := func(ranges ...string) *portal.Service {
		s := web(1)
		s.Portals[0].LoadBalancerIPs = addrs("203.0.113.10")
		for _, r := range ranges {
			s.Portals[0].SourceRanges = append(s.Portals[0].SourceRanges, netip.MustParsePrefix(r))
		}
		return s
	}
	b.sync(true, lb("192.168.50.0/24", "10.0.0.0/8"))
	if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
		t.Errorf("allowed client reached %s", pod)
	}
	b.sync(false, lb("10.0.0.0/8"))
	if _, err := n.dial(n.client, "203.0.113.10:80"); err == nil {
		t.Errorf("client outside the source ranges got through")
	}
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("cluster IP of the same port is not restricted: %s", pod)
	}
	// The kernel holds the set and the rule in the form a full sync
	// compares with: nothing to change.
	if st := b.sync(true, lb("10.0.0.0/8")); st.Messages != 0 {
		t.Errorf("a second full sync with source ranges sent %d messages", st.Messages)
	}
	// 0.0.0.0/0 (which hash:net cannot hold) lets everyone in.
	b.sync(false, lb("0.0.0.0/0"))
	if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
		t.Errorf("with 0.0.0.0/0: %s", pod)
	}
	b.sync(false, lb())
	if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
		t.Errorf("without source ranges: %s", pod)
	}
	if d := b.dump(); strings.Contains(d.Raw, rangeSetPrefix) {
		t.Errorf("a set left after the ranges went:\n%s", d.Raw)
	}
}

// TestSourceRangesScale: a Service's source ranges cost one iptables rule
// per load-balancer entry and one set lookup, whatever their number. With
// 1 and with 5000 ranges the rules are the same; the set holds the ranges;
// changing one range sends a message or two, not the whole list; allowed
// and refused clients are told apart among 5000 ranges. The time of a
// connection with each is logged.
func TestSourceRangesScale(t *testing.T) {
	n := newTestNet(t, 1)
	b := n.backend(testCfg)
	lb := func(count int, client bool) *portal.Service {
		s := web(1)
		p := s.Portals[0]
		p.LoadBalancerIPs = addrs("203.0.113.10", "203.0.113.11")
		for i := range count {
			// 10.x.y.0/24 ranges, none of which holds the client.
			p.SourceRanges = append(p.SourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24))
		}
		if client {
			p.SourceRanges = append(p.SourceRanges, netip.MustParsePrefix(clientIP+"/32"))
		}
		return s
	}
	inputRules := func() []string {
		d := b.dump()
		var out []string
		for _, l := range strings.Split(d.Raw, "\n") {
			if strings.HasPrefix(l, "-A "+chainInput+" ") {
				out = append(out, l)
			}
		}
		return out
	}
	// The fastest of 10 connections: the least disturbed by the machine.
	timeConns := func() time.Duration {
		best := time.Hour
		for range 10 {
			start := time.Now()
			if pod, _ := n.get(t, n.client, "203.0.113.10:80"); pod != "pod-1" {
				t.Fatalf("allowed client reached %q", pod)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	b.sync(true, lb(0, true))
	few := inputRules()
	oneRange := timeConns()
	st := b.sync(false, lb(5000, true))
	t.Logf("adding 5000 ranges: %d messages in %v", st.Messages, st.Duration)
	many := inputRules()
	if !slices.Equal(few, many) || len(many) != 2 {
		t.Errorf("iptables rules with 1 range:\n%s\nwith 5001:\n%s\nwant the same two (one per load-balancer IP)", strings.Join(few, "\n"), strings.Join(many, "\n"))
	}
	if d := b.dump(); !strings.Contains(d.Raw, "hash:net (5001)") {
		t.Errorf("the set does not hold 5001 ranges:\n%.2000s", d.Raw)
	}
	manyRanges := timeConns()
	// Once more each way, so that a drift of the machine shows as one.
	b.sync(false, lb(0, true))
	oneRange2 := timeConns()
	b.sync(false, lb(5000, true))
	manyRanges2 := timeConns()
	t.Logf("fastest of 10 connections through a load-balancer IP: %v, %v with 1 source range; %v, %v with 5001 (one hash:net lookup either way)",
		oneRange, oneRange2, manyRanges, manyRanges2)
	if st := b.sync(false, lb(5001, true)); st.Messages > 2 {
		t.Errorf("adding one range to 5000 sent %d messages, want 1", st.Messages)
	}
	b.sync(false, lb(5000, false))
	if _, err := n.dial(n.client, "203.0.113.10:80"); err == nil {
		t.Error("the client outside 5000 ranges got through")
	}
	if pod, _ := n.get(t, n.client, vip+":80"); pod != "pod-1" {
		t.Errorf("cluster IP: %s", pod)
	}
	if err := b.do(func(b *Backend) error { return b.Cleanup(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	left := newPlan()
	if err := b.do(func(b *Backend) error { return b.sets.read(left) }); err != nil || len(left.Sets) != 0 {
		t.Errorf("ipsets after Cleanup: %v %v", sortedKeys(left.Sets), err)
	}
}
