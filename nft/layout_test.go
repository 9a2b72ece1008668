package nft

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// previousLayout turns the table holding svc, whose ways in are flat, into
// what layout onehop6 wrote for it: no flat elements, a chain per Service
// port that the vips map sends its cluster IPs to, endpoint maps keyed
// mark . mark, without user data, holding the chain id in big-endian order
// . the index, and a rule that loads the id as an immediate. Their keys are
// as long as this layout's endpoint maps': only their type tells the two
// apart.
func previousLayout(t *testing.T, tp *topo, svc *portal.Service) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	tb := tp.b.table
	for _, f := range families {
		for _, s := range flatSets(tb, f) {
			c.FlushSet(s)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	maps := map[string]*nftables.Set{}
	for _, f := range families {
		for shard := range uint32(endpointShards) {
			s := &nftables.Set{Table: tb, Name: setEndpoints(f, shard), IsMap: true, Concatenation: true,
				KeyType:  nftables.MustConcatSetType(nftables.TypeMark, nftables.TypeMark),
				DataType: nftables.MustConcatSetType(addrType(f), nftables.TypeInetService)}
			c.DelSet(s)
			if err := c.AddSet(s, nil); err != nil {
				t.Fatal(err)
			}
			maps[s.Name] = s
			if shard%32 == 31 { // the library reads an ack per message
				if err := c.Flush(); err != nil {
					t.Fatalf("writing the previous layout: %v", err)
				}
			}
		}
	}
	for _, p := range svc.Portals {
		chain := portalChain(kindService, p.Key)
		id := tp.b.chainID(chain)
		oldID := binary.BigEndian.AppendUint32(nil, id)
		m := maps[setEndpoints(p.Key.Family, id)]
		var els []nftables.SetElement
		for i, ep := range p.ClusterEndpoints {
			els = append(els, nftables.SetElement{Key: append(bytes.Clone(oldID), numgenKey(uint32(i))...), Val: addrPortVal(ep)})
		}
		if err := c.SetAddElements(m, els); err != nil {
			t.Fatal(err)
		}
		ch := c.AddChain(&nftables.Chain{Name: chain, Table: tb})
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, UserData: []byte("onehop6 1 0000000000000000"),
			Exprs: []expr.Any{counter(),
				&expr.Immediate{Register: reg1, Data: oldID},
				&expr.Numgen{Register: reg32After(4), Modulus: uint32(len(p.ClusterEndpoints)), Type: unix.NFT_NG_RANDOM},
				&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: m.Name},
				dnatFrom(p.Key.Family, reg1)}})
		vips := &nftables.Set{Table: tb, Name: setVIPs(p.Key.Family), IsMap: true, Concatenation: true,
			KeyType:  nftables.MustConcatSetType(addrType(p.Key.Family), nftables.TypeInetProto, nftables.TypeInetService),
			DataType: nftables.TypeVerdict}
		for _, ip := range p.ClusterIPs {
			if err := c.SetAddElements(vips, []nftables.SetElement{{Key: vipKey(ip, p.Key.Protocol, p.Port),
				VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("writing the previous layout: %v", err)
	}
}

// TestUpgradeReplacesThePreviousLayout: an agent that finds the table of
// a previous layout, a chain per Service port and endpoint maps with
// another key type of the same length, replaces the table as a whole in
// one transaction. The Service's ways in are then flat, declared as nft
// prints them (no `[invalid type]` in `nft list`), new connections reach
// every endpoint, and a connection established through the previous table
// keeps its endpoint: conntrack is not touched.
func TestUpgradeReplacesThePreviousLayout(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.ClusterEndpoints = eps(8080, 0, 1)
	})
	tp.sync(t, snapshot(web), true)
	chain := portalChain(kindService, web.Portals[0].Key)
	previousLayout(t, tp, web)
	if seen, _ := ask(t, tp.client, "tcp", "10.96.0.10:80", 30); len(seen) != 2 {
		t.Fatalf("the previous layout's table: want both endpoints, got %v", seen)
	}
	ctx := context.Background()
	conn, err := nsutil.DialEcho(ctx, tp.client.Name, "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	before, err := conn.Ask(ctx)
	if err != nil {
		t.Fatal(err)
	}

	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD())) // the new version starts
	tp.sync(t, snapshot(web), true)
	k := readTable(t, tp)
	for _, want := range fixedSets(tp.b.table) {
		if have := k.set(want.Name); have == nil || !sameSetTypes(have, want) {
			t.Fatalf("set %s after the upgrade: %+v, want the types this version declares", want.Name, have)
		}
	}
	if _, ok := k.rules[chain]; ok || flatElems(k, chain) != 2 {
		t.Errorf("after the upgrade: chain %s is there (%v), %d flat elements name it; want no chain and 2 elements", chain, ok, flatElems(k, chain))
	}
	out, err := tp.node.Exec("nft", "list", "table", "inet", TableName)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "[invalid type]") || !strings.Contains(out, chain+`" : 10.244.`) {
		t.Errorf("nft lists the upgraded table with an invalid type or endpoints without their chain:\n%s", out)
	}
	if seen, _ := ask(t, tp.client, "tcp", "10.96.0.10:80", 30); len(seen) != 2 {
		t.Errorf("after the upgrade: want both endpoints, got %v", seen)
	}
	for range 3 {
		after, err := conn.Ask(ctx)
		if err != nil || after.Name != before.Name {
			t.Fatalf("the connection established before the upgrade: answered by %q (%v), want %q", after.Name, err, before.Name)
		}
	}
	// A restart over the upgraded table reconciles it in place.
	tp.b = New(tp.b.cfg, WithNetNS(tp.node.FD()))
	if st := tp.sync(t, snapshot(web), true); st.Messages != 0 {
		t.Errorf("a restart over the upgraded table sent %d messages, want 0", st.Messages)
	}
}
