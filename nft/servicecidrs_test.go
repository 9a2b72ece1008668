package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/portal"
)

// kernelSetText lists a set's elements as the kernel holds them, sorted.
func kernelSetText(t *testing.T, tp *topo, set string) []string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	s, err := c.GetSetByName(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}, set)
	if err != nil {
		t.Fatal(err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	return intervalText(els)
}

func intervalText(els []nftables.SetElement) []string {
	out := []string{}
	for _, e := range els {
		a, _ := netip.AddrFromSlice(e.Key)
		if e.IntervalEnd {
			out = append(out, "end "+a.String())
		} else {
			out = append(out, a.String())
		}
	}
	slices.Sort(out)
	return out
}

// chainHandles are the handles of a chain's rules: a rewritten rule gets
// a new one.
func chainHandles(t *testing.T, tp *topo, chain string) string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	rules, err := c.GetRules(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}, &nftables.Chain{Name: chain})
	if err != nil {
		t.Fatal(err)
	}
	var hs []string
	for _, r := range rules {
		hs = append(hs, fmt.Sprint(r.Handle))
	}
	return strings.Join(hs, ",")
}

// TestServiceCIDRsFollowTheSnapshot: Service CIDRs learned at run time
// are dropped when unallocated, with the configured range kept, and each
// change sends the changed spans' elements only, touching no rule:
// ranges adjacent to each other are one span, and removing the middle one
// splits it again.
func TestServiceCIDRsFollowTheSnapshot(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2) // configured: 10.96.0.0/16, fd00:96::/112
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1)
	})
	snap := func(cidrs ...string) *portal.Snapshot {
		s := snapshot(web)
		s.Dirty = nil
		s.ServiceCIDRs = portal.UnionCIDRs(prefixesOf(cidrs...))
		return s
	}
	tp.sync(t, snapshot(web), true)
	handles := chainHandles(t, tp, chainNoEndpoints)
	mustRefuse(t, tp.pods[0], "tcp", "10.96.0.10:81")
	mustDrop(t, tp.pods[0], "tcp", "10.96.0.99:80")

	for _, step := range []struct {
		cidrs []string
		v4    []string
		v6    []string
		// messages the sync may send: one per set and way (the elements
		// deleted from one set go in one message, those added in another)
		messages int
	}{
		{[]string{"10.97.0.0/24"}, []string{"10.96.0.0", "end 10.97.1.0"}, []string{"fd00:96::", "end fd00:96::1:0"}, 2},
		{[]string{"10.97.0.0/24", "10.97.1.0/24"}, []string{"10.96.0.0", "end 10.97.2.0"}, []string{"fd00:96::", "end fd00:96::1:0"}, 2},
		{[]string{"10.97.1.0/24", "fd00:97::/120"}, []string{"10.96.0.0", "10.97.1.0", "end 10.97.0.0", "end 10.97.2.0"},
			[]string{"fd00:96::", "fd00:97::", "end fd00:96::1:0", "end fd00:97::100"}, 3},
		{nil, []string{"10.96.0.0", "end 10.97.0.0"}, []string{"fd00:96::", "end fd00:96::1:0"}, 3},
	} {
		slices.Sort(step.v4)
		slices.Sort(step.v6)
		st := tp.sync(t, snap(step.cidrs...), false)
		if got := kernelSetText(t, tp, setServiceCIDRs(portal.IPv4)); !slices.Equal(got, step.v4) {
			t.Errorf("%v: the kernel's IPv4 set holds %v, want %v", step.cidrs, got, step.v4)
		}
		if got := kernelSetText(t, tp, setServiceCIDRs(portal.IPv6)); !slices.Equal(got, step.v6) {
			t.Errorf("%v: the kernel's IPv6 set holds %v, want %v", step.cidrs, got, step.v6)
		}
		if st.Messages > step.messages {
			t.Errorf("%v: the sync sent %d messages, want at most %d", step.cidrs, st.Messages, step.messages)
		}
		if h := chainHandles(t, tp, chainNoEndpoints); h != handles {
			t.Errorf("%v: the check chain's rules were rewritten (handles %s, were %s)", step.cidrs, h, handles)
		}
		if slices.Contains(step.cidrs, "10.97.1.0/24") {
			mustDrop(t, tp.pods[0], "tcp", "10.97.1.7:80")
		}
		mustRefuse(t, tp.pods[0], "tcp", "10.96.0.10:81")
	}

	// A restart reads the sets back: the same ranges send nothing, and a
	// range gone while it was down is deleted.
	tp.sync(t, snap("10.97.0.0/24"), false)
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	if st := tp.sync(t, snap("10.97.0.0/24"), true); st.Messages != 0 {
		t.Errorf("a restart with the same ranges sent %d messages", st.Messages)
	}
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	tp.sync(t, snap(), true)
	if got, want := kernelSetText(t, tp, setServiceCIDRs(portal.IPv4)), []string{"10.96.0.0", "end 10.97.0.0"}; !slices.Equal(got, want) {
		t.Errorf("after a restart without 10.97.0.0/24: %v, want %v", got, want)
	}
}

func prefixesOf(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// TestUpgradeRewritesTheCheckChain: a table left by a version that
// matched the configured Service CIDRs by prefix in the noep-check chain
// (the same configuration, so the same number of rules) gets the rules
// that look the set up, so that ranges learned at run time are dropped.
func TestUpgradeRewritesTheCheckChain(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 1)
	})
	tp.sync(t, snapshot(web), true)

	// The previous layout: the prefixes inline, and the tag without a marker.
	c, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	ch := &nftables.Chain{Name: chainNoEndpoints, Table: tp.b.table}
	oldTag := ruleTag(0, chainNoEndpoints+"|"+tp.b.cfgKey())
	c.FlushChain(ch)
	for _, r := range fixedRules(tp.b.cfg)[chainNoEndpoints] {
		if l, ok := r[len(r)-3].(*expr.Lookup); ok && strings.HasPrefix(l.SetName, "service-cidrs") {
			f := portal.IPv4
			if l.SetName == setServiceCIDRs(portal.IPv6) {
				f = portal.IPv6
			}
			for _, p := range tp.b.cfg.ServiceCIDRs {
				if portal.FamilyOf(p.Addr()) == f {
					r = cat(matchFamily(f), matchPrefix(f, true, p, expr.CmpOpEq), []expr.Any{counter(), verdict(expr.VerdictDrop, "")})
				}
			}
		}
		c.AddRule(&nftables.Rule{Table: tp.b.table, Chain: ch, Exprs: r, UserData: oldTag})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	s := snapshot(web)
	s.ServiceCIDRs = prefixesOf("10.97.1.0/24")
	tp.sync(t, s, true)
	rules, err := c.GetRules(tp.b.table, ch)
	if err != nil {
		t.Fatal(err)
	}
	looked := map[string]bool{}
	for _, r := range rules {
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok {
				looked[l.SetName] = true
			}
		}
	}
	for _, f := range families {
		if !looked[setServiceCIDRs(f)] {
			t.Errorf("after the upgrade no rule of %s looks up @%s", chainNoEndpoints, setServiceCIDRs(f))
		}
	}
	mustDrop(t, tp.pods[0], "tcp", "10.97.1.7:80")
	mustRefuse(t, tp.pods[0], "tcp", "10.96.0.10:81")
}
