package nft

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// A chain's tag is a function of its body and the configuration alone:
// its bytes are pinned here, since a new tag for the same body makes the
// first sync after an upgrade rewrite every chain (and lose its counters).
// The tag of a chain with affinity changed once, when the affinity sets
// became the portal's, shared by its chains: their rules name other sets.
func TestBodyTagIsPinned(t *testing.T) {
	b := New(dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, MasqueradeBit: 14})
	body := chainBody{family: portal.IPv4, shortCircuit: "svc4/ns/web/tcp/http", affinity: 10800,
		endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.2:8080"), netip.MustParseAddrPort("10.244.2.3:8080")}}
	const want = "onehop8 7 58a5cb98c9c51f0e"
	if got := string(b.bodyTag(7, body)); got != want {
		t.Errorf("bodyTag = %q, want %q", got, want)
	}
}

// envRestartNetns names the namespace TestRestartedProcessRewritesNothing
// has its child process sync into.
const envRestartNetns = "ONEHOP_NFT_RESTART_NETNS"

// A new process finds the table the last one left and rewrites nothing:
// no chain flushed, so its counters (and affinity) go on. A tag that
// depended on anything but the rules (once, a pointer fmt printed from
// inside netip.Addr) made every restart rewrite every chain.
func TestRestartedProcessRewritesNothing(t *testing.T) {
	if name := os.Getenv(envRestartNetns); name != "" {
		// The child: the process before the restart.
		f, err := os.Open("/run/netns/" + name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		be := New(restartConfig(), WithNetNS(int(f.Fd())))
		snap := bigSnapshot(50, 3)
		if _, err := be.Sync(context.Background(), snap, true); err != nil {
			t.Fatal(err)
		}
		// Then endpoints move, as pods are replaced: element updates,
		// which leave the rules as they are.
		if _, err := be.Sync(context.Background(), restartMoved(snap), false); err != nil {
			t.Fatal(err)
		}
		return
	}
	ns := nsutil.New(t, "ohrs-")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRestartedProcessRewritesNothing$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRestartNetns+"="+ns.Name)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the first process: %v\n%s", err, out)
	}
	be := New(restartConfig(), WithNetNS(ns.FD()))
	t.Cleanup(func() { _ = be.Cleanup(context.Background()) })
	snap := restartMoved(bigSnapshot(50, 3))
	snap.Dirty = nil
	st, err := be.Sync(context.Background(), snap, true)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ReadBack || st.Messages != 0 {
		t.Errorf("the restarted process read the table back: %v, and sent %d messages; want it read and nothing sent", st.ReadBack, st.Messages)
	}
}

// restartMoved replaces the endpoints of two Services of snap, one with
// three endpoints and one with a single endpoint, and marks them dirty.
func restartMoved(snap *portal.Snapshot) *portal.Snapshot {
	for _, m := range []*portal.Service{makeBigService(7, 3, 1), makeBigService(8, 1, 5)} {
		snap.Services[m.Key] = m
		snap.Dirty = append(snap.Dirty, m.Key)
	}
	return snap
}

func restartConfig() dataplane.Config {
	return dataplane.Config{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")}}
}

// One endpoint changed, in a Service whose ways in are flat, is an
// element update per way in, and no rule of the table changes: the kernel
// has no new rule to validate the whole table for.
func TestOneEndpointChangeKeepsTheRules(t *testing.T) {
	be := benchBackendT(t)
	ctx := context.Background()
	snap := bigSnapshot(3, 1)
	if _, err := be.Sync(ctx, snap, true); err != nil {
		t.Fatal(err)
	}
	conn, err := newConn(be.netnsFD)
	if err != nil {
		t.Fatal(err)
	}
	handles := func() []uint64 {
		chains, err := conn.ListChainsOfTableFamily(be.table.Family)
		if err != nil {
			t.Fatal(err)
		}
		var hs []uint64
		for _, c := range chains {
			if c.Table.Name != be.table.Name {
				continue
			}
			rules, err := conn.GetRules(be.table, c)
			if err != nil {
				t.Fatalf("rules of %s: %v", c.Name, err)
			}
			for _, r := range rules {
				hs = append(hs, r.Handle)
			}
		}
		slices.Sort(hs)
		return hs
	}
	before := handles()
	key := bigService(1, 1, 0)
	snap.Services[key] = makeBigService(1, 1, 1)
	snap.Dirty = []portal.ServiceKey{key}
	st, err := be.Sync(ctx, snap, false)
	if err != nil {
		t.Fatal(err)
	}
	if after := handles(); len(before) == 0 || !slices.Equal(before, after) {
		t.Errorf("the table's rules went from %v to %v; want the same rules", before, after)
	}
	if st.Messages != 4 {
		t.Errorf("%d messages, want 4 (for the cluster IP and the node port, the old element out and the new one in)", st.Messages)
	}
}
