package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// The kernel's own account of a packet's way: the nftables trace facility.
// A table of the test's own, in the node namespace only, sets `meta nftrace`
// on the client's packets; the kernel then reports every rule of onehop's
// table that the packet matched on the NFNLGRP_NFTRACE netlink group. The
// evaluated trace must list the same rules, in the same order.

// kernelRules marks the packets from src entering the node for tracing,
// runs send, and returns the rules of table onehop the kernel reports them
// matching, as chain#handle, in order.
func kernelRules(t *testing.T, tp *topo, src netip.Addr, send func()) []string {
	t.Helper()
	lis, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: tp.node.FD()})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if err := lis.JoinGroup(unix.NFNLGRP_NFTRACE); err != nil {
		t.Fatalf("join the nftrace group: %v", err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(tp.node.FD()))
	if err != nil {
		t.Fatal(err)
	}
	tbl := conn.AddTable(&nftables.Table{Name: nsutil.Unique("ohtrace-"), Family: nftables.TableFamilyINet})
	// Packets arriving (prerouting) and the node's own (output).
	f := portal.FamilyOf(src)
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput} {
		ch := conn.AddChain(&nftables.Chain{Name: "mark-" + hookName(*hook), Table: tbl, Type: nftables.ChainTypeFilter,
			Hooknum: hook, Priority: nftables.ChainPriorityRaw})
		conn.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: cat(matchFamily(f), []expr.Any{
			loadAddr(f, false, reg1),
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: addrBytes(src)},
			&expr.Immediate{Register: reg1, Data: []byte{1}},
			&expr.Meta{Key: expr.MetaKeyNFTRACE, SourceRegister: true, Register: reg1},
		})})
	}
	if err := conn.Flush(); err != nil {
		t.Fatalf("add the marking table: %v", err)
	}
	defer func() {
		conn.DelTable(tbl)
		if err := conn.Flush(); err != nil {
			t.Errorf("delete the marking table: %v", err)
		}
	}()
	send()
	var rules []string
	for {
		if err := lis.SetReadDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		msgs, err := lis.Receive()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return rules
		}
		if err != nil {
			t.Fatalf("nftrace: %v", err)
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_TRACE) || len(m.Data) < 4 {
				continue
			}
			if r, ok := decodeTraceRule(t, m.Data[4:]); ok {
				rules = append(rules, r)
			}
		}
	}
}

// decodeTraceRule reads a trace event: chain#handle, and whether it is a
// rule of table onehop that the packet matched.
func decodeTraceRule(t *testing.T, b []byte) (string, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		t.Fatal(err)
	}
	ad.ByteOrder = binary.BigEndian
	var table, chain string
	var handle uint64
	var typ uint32
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_TRACE_TABLE:
			table = ad.String()
		case unix.NFTA_TRACE_CHAIN:
			chain = ad.String()
		case unix.NFTA_TRACE_RULE_HANDLE:
			handle = ad.Uint64()
		case unix.NFTA_TRACE_TYPE:
			typ = ad.Uint32()
		}
	}
	if err := ad.Err(); err != nil {
		t.Fatal(err)
	}
	// An event without a rule handle is a chain's end (its return, or the
	// base chain's policy), which the evaluated trace does not list as a rule.
	return fmt.Sprintf("%s#%d", chain, handle), table == TableName && typ == unix.NFT_TRACETYPE_RULE && handle != 0
}

// evaluatedRules are the rules of the trace's path to endpoint ("" for a
// packet not translated), as chain#handle, in order.
func evaluatedRules(t *testing.T, tr *dataplane.Trace, endpoint string) []string {
	t.Helper()
	for _, o := range tr.Outcomes {
		if o.Endpoint != endpoint {
			continue
		}
		var out []string
		for _, s := range slices.Concat(tr.Steps, o.Steps) {
			if s.Rule != "" {
				out = append(out, fmt.Sprintf("%s#%d", s.Chain, s.Handle))
			}
		}
		return out
	}
	t.Fatalf("the trace has no path to %q: %+v", endpoint, tr.Outcomes)
	return nil
}

func TestTraceMatchesTheKernelsTrace(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 3)
	web := service("web", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{clusterIP}
		p.NodePort = 30080
		p.LoadBalancerIPs = []netip.Addr{lbIP}
		p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/25")}
		p.ClusterEndpoints = eps(8080, 1, 2)
	})
	local := service("local", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		p.ExternalIPs = []netip.Addr{extIP}
		p.ExternalLocal = true
		p.ClusterEndpoints = eps(8080, 1, 2)
		p.LocalEndpoints = eps(8080, 2)
	})
	sticky := service("sticky", func(p *portal.Portal) {
		p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.12")}
		p.ClusterEndpoints = eps(8080, 1, 2)
		p.Affinity.TimeoutSeconds = 600
	})
	empty := service("empty", func(p *portal.Portal) { p.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.13")} })
	tp.sync(t, snapshot(web, local, sticky, empty), true)
	for _, c := range []struct {
		name string
		from *nsutil.NS
		src  netip.Addr
		dst  string
	}{
		{"cluster IP from a pod", tp.pods[0], podIP(0), "10.96.0.10:80"},
		{"node port, Cluster policy", tp.client, netip.MustParseAddr(clientIP), nodeIP + ":30080"},
		{"load-balancer IP within the source ranges", tp.client, netip.MustParseAddr(clientIP), "203.0.113.11:80"},
		{"load-balancer IP outside the source ranges", tp.client2, netip.MustParseAddr(client2IP), "203.0.113.11:80"},
		{"external IP, Local policy", tp.client, netip.MustParseAddr(clientIP), "203.0.113.10:80"},
		{"affinity, first connection", tp.pods[0], podIP(0), "10.96.0.12:80"},
		{"affinity, pinned", tp.pods[0], podIP(0), "10.96.0.12:80"},
		{"no endpoints", tp.pods[0], podIP(0), "10.96.0.13:80"},
		// The node's source is the one routing picks towards the
		// destination: the uplink's (default route) for a cluster IP, the
		// address itself for one of its own.
		{"the node to a cluster IP", tp.node, netip.MustParseAddr(nsutil.UplinkIP), "10.96.0.10:80"},
		{"the node to its own node port", tp.node, netip.MustParseAddr(nodeIP), nodeIP + ":30080"},
		{"undefined port", tp.pods[0], podIP(0), "10.96.0.10:81"},
	} {
		var tr *dataplane.Trace
		if c.from == tp.node {
			tr = traceQuery(t, tp, netip.Addr{}, "udp", c.dst)
			if tr.From != "node ("+c.src.String()+")" {
				t.Fatalf("%s: the trace picks source %s, want %s", c.name, tr.From, c.src)
			}
		} else {
			tr = traceQuery(t, tp, c.src, "udp", c.dst)
		}
		endpoint := ""
		got := kernelRules(t, tp, c.src, func() {
			r, err := c.from.Ask("udp", c.dst, 700*time.Millisecond)
			for i := range tp.pods {
				if err == nil && r.Name == nsutil.PodName(i) {
					endpoint = netip.AddrPortFrom(podIP(i), nsutil.EchoPort).String()
				}
			}
		})
		want := evaluatedRules(t, tr, endpoint)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the kernel's trace went through\n\t%v\nthe evaluated trace through\n\t%v", c.name, got, want)
		}
	}
}
