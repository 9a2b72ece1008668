package nft

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/onehop/onehop/portal"
)

// flatElems counts the elements of the flat maps whose comment names chain.
func flatElems(k *kernelTable, chain string) int {
	n := 0
	for _, s := range k.sets {
		if !isFlatMap(s.name) {
			continue
		}
		for _, el := range k.elems[s.name] {
			if strings.HasSuffix(el.Comment, " "+chain) {
				n++
			}
		}
	}
	return n
}

// ruleHandles lists the handles of every rule in the table, and its chains.
func ruleHandles(t *testing.T, tp *topo) (chains []string, handles []uint64) {
	t.Helper()
	k := readTable(t, tp)
	for _, name := range k.chains {
		for _, r := range k.rules[name] {
			handles = append(handles, r.Handle)
		}
	}
	slices.Sort(handles)
	return k.chains, handles
}

// TestFlatServiceTouchesNoRule: a plain Service created beside another,
// grown from one endpoint to three, moved to other pods, shrunk, and
// deleted: after every step the table has the same chains and the same
// rules, by handle, and its cluster IP and node port reach exactly its
// endpoints, each of them. A chain per Service fails the first step.
func TestFlatServiceTouchesNoRule(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 4)
	other := service("other", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		p.ClusterEndpoints = eps(8080, 3)
	})
	tp.sync(t, snapshot(other), true)
	chains, handles := ruleHandles(t, tp)
	web := func(idx ...int) *portal.Service {
		return service("web", func(p *portal.Portal) {
			p.ClusterIPs = []netip.Addr{clusterIP}
			p.ClusterEndpoints = eps(8080, idx...)
			p.NodePort = 30080
		})
	}
	for _, step := range []struct {
		name string
		pods []int
	}{
		{"created", []int{0}},
		{"grown", []int{0, 1, 2}},
		{"moved", []int{1, 2, 3}},
		{"shrunk", []int{3}},
		{"deleted", nil},
	} {
		snap := snapshot(other)
		if step.pods != nil {
			snap = snapshot(other, web(step.pods...))
		}
		snap.Dirty = []portal.ServiceKey{{Namespace: "default", Name: "web"}}
		st := tp.sync(t, snap, false)
		c, h := ruleHandles(t, tp)
		if !slices.Equal(c, chains) || !slices.Equal(h, handles) {
			t.Errorf("%s: the table's chains went from %v to %v, its rules from %v to %v; want none changed", step.name, chains, c, handles, h)
		}
		want := map[string]bool{}
		for _, i := range step.pods {
			want[fmt.Sprintf("pod%d", i)] = true
		}
		for _, addr := range []string{"10.96.0.10:80", nodeIP + ":30080"} {
			if step.pods == nil {
				if _, err := tp.client.Ask("tcp", addr, 300*time.Millisecond); err == nil {
					t.Errorf("%s: %s still answers", step.name, addr)
				}
				continue
			}
			seen, _ := ask(t, tp.client, "tcp", addr, 12*len(step.pods))
			for name := range seen {
				if !want[name] {
					t.Errorf("%s: %s reached %s, not an endpoint (%v)", step.name, addr, name, seen)
				}
			}
			if len(seen) != len(want) {
				t.Errorf("%s: %s reached %v, want each of %v", step.name, addr, seen, want)
			}
		}
		t.Logf("%s: %d messages", step.name, st.Messages)
	}
	if d, err := tp.b.Dump(context.Background()); err != nil || len(d.Ports) != 2 {
		t.Errorf("dump after the deletion: %v, %v; want other's two ports", d, err)
	}
}

// TestRestartRewritesLargeFlatMaps: over more flat elements than a full
// sync reads back, a new process empties the flat maps and writes them
// anew: a Service deleted while no agent ran leaves, a changed one is
// updated, someone's stray element goes, and the table is the one a fresh
// sync of the same Services writes.
func TestRestartRewritesLargeFlatMaps(t *testing.T) {
	ctx := context.Background()
	n := flatReadBackMax/20 + 100 // x 10 endpoints x 2 ways in
	old := benchBackendT(t)
	snap := bigSnapshot(n, 10)
	if _, err := old.Sync(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	gone, moved := bigService(5, 10, 0), makeBigService(7, 10, 1)
	delete(snap.Services, gone)
	snap.Services[moved.Key] = moved
	stray, err := newConn(old.netnsFD)
	if err != nil {
		t.Fatal(err)
	}
	m := &nftables.Set{Table: old.table, Name: setFlat(portal.IPv4, 10)}
	key := append(vipKey(netip.MustParseAddr("10.99.0.1"), portal.TCP, 80), numgenKey(0)...)
	if err := stray.SetAddElements(m, []nftables.SetElement{{Key: key, Val: addrPortVal(netip.MustParseAddrPort("10.1.2.3:80"))}}); err != nil {
		t.Fatal(err)
	}
	if err := stray.Flush(); err != nil {
		t.Fatal(err)
	}

	restarted := New(old.cfg, WithNetNS(old.netnsFD))
	st, err := restarted.Sync(ctx, snap, true)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ReadBack || st.Messages == 0 {
		t.Errorf("restart: read back %v, %d messages; want a read and the flat maps written", st.ReadBack, st.Messages)
	}
	fresh := benchBackendT(t)
	if _, err := fresh.Sync(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	have, err := readKernel(old.netnsFD, old.table)
	if err != nil {
		t.Fatal(err)
	}
	want, err := readKernel(fresh.netnsFD, fresh.table)
	if err != nil {
		t.Fatal(err)
	}
	if d := lineDiff(want.render(), have.render()); d != "" {
		t.Errorf("the restarted table differs from a fresh one:\n%s", d)
	}
	if flatElems(have, "svc4/bench/svc-5/tcp/http") != 0 || strings.Contains(have.render(), "10.99.0.1") {
		t.Errorf("a deleted Service's or a stray element is still in the flat maps")
	}
}
