package nft

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/portal"
)

// An agent upgraded from the layout that checked node ports in noep-check,
// from filter-output too, moves the check to noep-nodeport-check, jumped to
// from filter-input only: the node's own datagram to its node port of a
// Service without endpoints was failed on output (EPERM) and is refused
// (ICMP port unreachable) after the first sync, as by kube-proxy.
func TestUpgradeChecksNodePortsOnInputOnly(t *testing.T) {
	t.Parallel()
	tp, web := newTopoWithoutEndpoints(t)
	const np = nodeIP + ":30080"

	// The previous layout: the node ports checked in noep-check, after the
	// way in's check of each family, and one jump from every filter chain.
	c, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	rules := fixedRules(tp.b.cfg)
	var old [][]expr.Any
	for i := range families {
		old = append(old, rules[chainNoEndpoints][i], rules[chainNoEndpointsNP][i])
	}
	old = append(old, rules[chainNoEndpoints][len(families):]...)
	check := &nftables.Chain{Name: chainNoEndpoints, Table: tp.b.table}
	input := &nftables.Chain{Name: chainFilterInput, Table: tp.b.table}
	c.FlushChain(check)
	c.FlushChain(input)
	for _, r := range old {
		c.AddRule(&nftables.Rule{Table: tp.b.table, Chain: check, Exprs: r,
			UserData: ruleTag(0, chainNoEndpoints+"|"+tp.b.cfgKey()+"|service-cidrs set")})
	}
	c.AddRule(&nftables.Rule{Table: tp.b.table, Chain: input, Exprs: rules[chainFilterInput][0],
		UserData: ruleTag(0, chainFilterInput+"|"+tp.b.cfgKey())})
	c.DelChain(&nftables.Chain{Name: chainNoEndpointsNP, Table: tp.b.table})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := tp.node.Ask("udp", np, 2*time.Second); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("the previous layout: want the node's datagram to its node port failed with EPERM, got %v", err)
	}

	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	tp.sync(t, snapshot(web), true)
	for _, ch := range []string{chainFilterForward, chainFilterOutput, chainNoEndpoints} {
		got, err := c.GetRules(tp.b.table, &nftables.Chain{Name: ch, Table: tp.b.table})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range got {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok && (l.SetName == setNodePortIPs(portal.IPv4) || l.SetName == setNodePortIPs(portal.IPv6)) {
					t.Errorf("after the upgrade chain %s still checks node ports", ch)
				}
				if v, ok := e.(*expr.Verdict); ok && v.Chain == chainNoEndpointsNP {
					t.Errorf("after the upgrade chain %s jumps to %s", ch, chainNoEndpointsNP)
				}
			}
		}
	}
	for _, network := range []string{"udp", "tcp"} {
		mustRefuse(t, tp.node, network, np)
		mustRefuse(t, tp.client, network, np)
	}
	mustRefuse(t, tp.pods[0], "udp", "10.96.0.10:80")
}
