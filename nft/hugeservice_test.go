package nft

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
)

// hugeService is a LoadBalancer Service with ports TCP ports, one cluster
// IP, one load-balancer IP, two endpoints per port and the given source
// ranges.
func hugeService(ports int, ranges []netip.Prefix) *portal.Service {
	key := portal.ServiceKey{Namespace: "default", Name: "huge"}
	s := &portal.Service{Key: key}
	for i := 0; i < ports; i++ {
		s.Portals = append(s.Portals, &portal.Portal{
			Key:              portal.PortKey{Service: key, Port: fmt.Sprintf("p%d", i), Protocol: portal.TCP, Family: portal.IPv4},
			Port:             uint16(10000 + i),
			ClusterIPs:       []netip.Addr{netip.MustParseAddr("10.96.0.50")},
			LoadBalancerIPs:  []netip.Addr{lbIP},
			SourceRanges:     ranges,
			ClusterEndpoints: eps(8080, 0, 1),
		})
	}
	slices.SortFunc(s.Portals, func(a, b *portal.Portal) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	return s
}

// ordinaryServices are n one-port Services, each with a cluster IP, a
// load-balancer IP and two endpoints: as many chains and ways in as a
// Service of n ports.
func ordinaryServices(n int) []*portal.Service {
	var out []*portal.Service
	for i := 0; i < n; i++ {
		key := portal.ServiceKey{Namespace: "many", Name: fmt.Sprintf("s%d", i)}
		out = append(out, &portal.Service{Key: key, Portals: []*portal.Portal{{
			Key:              portal.PortKey{Service: key, Port: "p", Protocol: portal.TCP, Family: portal.IPv4},
			Port:             80,
			ClusterIPs:       []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 100 + byte(i>>8), byte(i)})},
			LoadBalancerIPs:  []netip.Addr{netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})},
			ClusterEndpoints: eps(8080, 0, 1),
		}}})
	}
	return out
}

// otherSyncCost is what the syncs of a small Service cost beside a table.
type otherSyncCost struct {
	// endpoints: its endpoints go from two to one and back (the rule that
	// picks one is rewritten); swap: another endpoint in place (element
	// updates only); add: it is created and deleted again.
	endpoints, swap, add time.Duration
	// msgs are the messages of one round of the three changes.
	msgs [3]int
}

func (c otherSyncCost) String() string {
	return fmt.Sprintf("endpoints %v, swap %v, add/delete %v (messages %v)", c.endpoints, c.swap, c.add, c.msgs)
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// measureOther syncs the big Services, then reps times each change of the
// small Service "web" beside them, and returns the medians.
func measureOther(t *testing.T, reps int, big []*portal.Service) otherSyncCost {
	t.Helper()
	b := benchBackendT(t)
	ctx := context.Background()
	snap := snapshot(big...)
	web := func(idx ...int) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, idx...)
		})
	}
	sync := func(s *portal.Service, del bool) (time.Duration, int) {
		t.Helper()
		if del {
			delete(snap.Services, s.Key)
		} else {
			snap.Services[s.Key] = s
		}
		snap.Dirty = []portal.ServiceKey{s.Key}
		st, err := b.Sync(ctx, snap, false)
		if err != nil {
			t.Fatal(err)
		}
		return st.Duration, st.Messages
	}
	snap.Services[web(0, 1).Key] = web(0, 1)
	if _, err := b.Sync(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	var c otherSyncCost
	var eps, swap, add []time.Duration
	for i := 0; i < reps; i++ {
		d1, m1 := sync(web(0), false)
		d2, m2 := sync(web(0, 1), false)
		eps = append(eps, d1, d2)
		d3, m3 := sync(web(2, 1), false)
		d4, m4 := sync(web(0, 1), false)
		swap = append(swap, d3, d4)
		d5, m5 := sync(web(0, 1), true)
		d6, m6 := sync(web(0, 1), false)
		add = append(add, d5, d6)
		c.msgs = [3]int{m1 + m2, m3 + m4, m5 + m6}
	}
	c.endpoints, c.swap, c.add = median(eps), median(swap), median(add)
	return c
}

// TestHugeServiceSyncCost measures the syncs of a small Service (a) alone,
// (b) beside a Service of 5,000 ports, (c) the same with 1,000 source
// ranges and (d) beside 5,000 one-port Services, and logs the medians of
// 20 syncs of each change and their ratio to (a). A sync that writes a
// rule or a jump makes the kernel validate every chain the base chains
// reach, so its time grows with the table, (b) and (d) alike; source
// ranges must not add to it (they add one chain, not one per port). The
// messages the small Service's syncs send are the same beside any table.
func TestHugeServiceSyncCost(t *testing.T) {
	if testing.Short() {
		t.Skip("syncs 5,000-port tables")
	}
	const reps = 10 // two syncs of each change per round
	ranges := manyRanges(1000, clientIP, client2IP)
	cases := []struct {
		name string
		big  []*portal.Service
	}{
		{"(a) alone", nil},
		{"(b) 5,000 ports", []*portal.Service{hugeService(5000, nil)}},
		{"(c) 5,000 ports, 1,000 ranges", []*portal.Service{hugeService(5000, ranges)}},
		{"(d) 5,000 Services", ordinaryServices(5000)},
	}
	var alone otherSyncCost
	for i, c := range cases {
		cost := measureOther(t, reps, c.big)
		if i == 0 {
			alone = cost
		}
		ratio := func(d, a time.Duration) float64 { return float64(d) / float64(a) }
		t.Logf("%-30s %v; x%.1f, x%.1f, x%.1f of (a)", c.name, cost,
			ratio(cost.endpoints, alone.endpoints), ratio(cost.swap, alone.swap), ratio(cost.add, alone.add))
		if cost.msgs != alone.msgs {
			t.Errorf("%s: the small Service's syncs sent %v messages, %v alone", c.name, cost.msgs, alone.msgs)
		}
	}
}
