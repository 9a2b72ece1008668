package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/portal"
)

// TestFullSyncTrustsAnUntouchedKernel: a full sync over a kernel nobody
// committed to since this process's last sync neither reads the table back
// nor sends anything; any commit by someone else, in any table, makes the
// next full sync read the table and repair what was changed in onehop's.
func TestFullSyncTrustsAnUntouchedKernel(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
		p.ClusterEndpoints = eps(8080, 0, 1)
	})
	other := service("other", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		p.ClusterEndpoints = eps(8080, 1)
	})
	if st := tp.sync(t, snapshot(web, other), true); !st.ReadBack {
		t.Fatal("the first full sync did not read the kernel's state")
	}
	if st := tp.sync(t, snapshot(web, other), true); st.ReadBack || st.Messages != 0 {
		t.Errorf("full sync over an untouched kernel: read back %v, %d messages; want no read, 0 messages", st.ReadBack, st.Messages)
	}
	// A partial sync keeps the proof: the generation moves by exactly its
	// own transaction.
	web2 := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
		p.ClusterEndpoints = eps(8080, 0)
	})
	tp.sync(t, snapshot(web2, other), false)
	if st := tp.sync(t, snapshot(web2, other), true); st.ReadBack || st.Messages != 0 {
		t.Errorf("full sync after a partial one: read back %v, %d messages; want no read, 0 messages", st.ReadBack, st.Messages)
	}
	// A Service gone from the snapshot leaves in a full sync without
	// reading back, too.
	if st := tp.sync(t, snapshot(web2), true); st.ReadBack || st.Messages == 0 {
		t.Errorf("full sync without 'other': read back %v, %d messages; want no read and its removal", st.ReadBack, st.Messages)
	}
	if out := listTable(t, tp); strings.Contains(out, "10.96.0.11") {
		t.Errorf("'other' still programmed:\n%s", out)
	}
	tp.sync(t, snapshot(web, other), true)
	// (Added again, 'other' may have other chain ids: its endpoints'
	// elements name their chain.)
	want := listTable(t, tp)

	// Someone else's table: read back, nothing to repair.
	tp.node.Run(t, "nft", "add", "table", "inet", "someone-else")
	if st := tp.sync(t, snapshot(web, other), true); !st.ReadBack || st.Messages != 0 {
		t.Errorf("after another table changed: read back %v, %d messages; want a read, 0 messages", st.ReadBack, st.Messages)
	}
	// Someone deletes an element of onehop's: read back and repaired.
	tp.node.Run(t, "nft", "delete", "element", "inet", TableName, setFlatGate(portal.IPv4), "{ 10.96.0.11 . tcp . 80 }")
	if st := tp.sync(t, snapshot(web, other), true); !st.ReadBack || st.Messages == 0 {
		t.Errorf("after an element of onehop's was deleted: read back %v, %d messages; want a read and a repair", st.ReadBack, st.Messages)
	}
	// (nft lists a set's elements in the order they were added.)
	if d := lineDiff(want, listTable(t, tp)); d != "" {
		t.Errorf("table after the repair differs from the one synced:\n%s", d)
	}
	seen, _ := ask(t, tp.pods[0], "tcp", "10.96.0.11:80", 3)
	if seen["pod1"] != 3 {
		t.Errorf("the repaired Service answered %v, want pod1 only", seen)
	}
}

// listTable is the onehop table as nft lists it, without counters.
func listTable(t *testing.T, tp *topo) string {
	t.Helper()
	out, err := tp.node.Exec("nft", "-s", "list", "table", "inet", TableName)
	if err != nil {
		t.Fatalf("nft list table: %v\n%s", err, out)
	}
	return out
}
