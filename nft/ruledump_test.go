package nft

import (
	"context"
	"github.com/onehop/onehop/portal"
	"maps"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Reading the rules chain by chain (large tables) finds what one dump of
// the table finds, a chain someone added a rule to included, and a new
// process reading that way rewrites nothing of an intact table.
func TestRuleDumpPerChainReadsTheSame(t *testing.T) {
	be := benchBackendT(t)
	ctx := context.Background()
	snap := bigSnapshot(300, 3)
	for _, svc := range snap.Services {
		svc.Portals[0].Balancing = portal.BalancingMaglev // a chain each
	}
	if _, err := be.Sync(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	conn, err := newConn(be.netnsFD)
	if err != nil {
		t.Fatal(err)
	}
	read := func(perChainFrom int) *kernelState {
		t.Helper()
		b := New(be.cfg, WithNetNS(be.netnsFD))
		b.ruleDumpPerChainFrom = perChainFrom
		k, err := b.readState(conn, nil, false)
		if err != nil || k == nil {
			t.Fatalf("read the table back: %v, %v", k, err)
		}
		return k
	}
	whole, perChain := read(1<<30), read(1)
	if len(whole.rules) < 300 || !maps.Equal(whole.rules, perChain.rules) || !maps.EqualFunc(whole.tags, perChain.tags, func(a, b []byte) bool { return string(a) == string(b) }) {
		t.Fatalf("one dump of the table read %d chains' rules, chain by chain %d; want the same counts and tags", len(whole.rules), len(perChain.rules))
	}

	// A new process that reads chain by chain rewrites nothing.
	b := New(be.cfg, WithNetNS(be.netnsFD))
	b.ruleDumpPerChainFrom = 1
	st, err := b.Sync(ctx, snap, true)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ReadBack || st.Messages != 0 {
		t.Errorf("read back %v, %d messages; want the table read and nothing sent", st.ReadBack, st.Messages)
	}

	// A rule added to one of onehop's chains is seen either way, and the
	// next full sync puts the chain back.
	key := bigService(5, 3, 0)
	chain := "svc4/" + key.Namespace + "/" + key.Name + "/tcp/http"
	conn.AddRule(&nftables.Rule{Table: be.table, Chain: &nftables.Chain{Name: chain, Table: be.table}, Exprs: []expr.Any{&expr.Counter{}}})
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	whole, perChain = read(1<<30), read(1)
	if whole.rules[chain] != perChain.rules[chain] || perChain.rules[chain] < 2 {
		t.Fatalf("after a rule was added to %s: %d rules in one dump, %d chain by chain", chain, whole.rules[chain], perChain.rules[chain])
	}
	b = New(be.cfg, WithNetNS(be.netnsFD))
	b.ruleDumpPerChainFrom = 1
	if st, err = b.Sync(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	if st.Messages == 0 {
		t.Errorf("the full sync left the added rule in %s", chain)
	}
	if n := read(1).rules[chain]; n != whole.rules[chain]-1 {
		t.Errorf("%s has %d rules after the full sync, want %d", chain, n, whole.rules[chain]-1)
	}
}
