package main

import (
	"context"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestLeftoverSplitRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			[]string{"-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}},
		{`-A X -m comment --comment "say \"hi\" \\ ok" -g KUBE-SVC-A`,
			[]string{"-A", "X", "-m", "comment", "--comment", `say "hi" \ ok`, "-g", "KUBE-SVC-A"}},
		{`-A X --comment ""`, []string{"-A", "X", "--comment", ""}},
		{`-N KUBE-SEP-1`, []string{"-N", "KUBE-SEP-1"}},
	} {
		got, err := leftoverSplitRule(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("split %s = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := leftoverSplitRule(`-A X --comment "open`); err == nil {
		t.Error("unterminated quote: no error")
	}
}

func TestIsKubeProxyChain(t *testing.T) {
	for _, tc := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SVC-ABCDEF", true}, {"nat", "KUBE-SERVICES", true}, {"filter", "KUBE-FORWARD", true},
		{"mangle", "KUBE-PROXY-CANARY", true},
		{"filter", "KUBE-FIREWALL", false}, {"nat", "KUBE-MARK-DROP", false}, {"mangle", "KUBE-KUBELET-CANARY", false},
		{"mangle", "KUBE-IPTABLES-HINT", false}, {"filter", "KUBE-SVC-X", false}, {"nat", "CNI-1234", false},
	} {
		if got := isKubeProxyChain(tc.table, tc.chain); got != tc.want {
			t.Errorf("isKubeProxyChain(%s, %s) = %v, want %v", tc.table, tc.chain, got, tc.want)
		}
	}
}

// kubeProxyRuleset is what kube-proxy (iptables mode) and the kubelet leave
// in a node's tables, plus a chain and a rule of someone else.
const kubeProxyRuleset = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-MARK-DROP - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-EXT-CCCCCCCCCCCCCCCC - [0:0]
:CNI-KEEP - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j CNI-KEEP
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.244.0.0/16 -j MASQUERADE
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SEP-BBBBBBBBBBBBBBBB -s 192.0.2.10/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -m tcp -j DNAT --to-destination 192.0.2.10:6443
-A KUBE-NODEPORTS -p tcp -m tcp --dport 30080 -j KUBE-EXT-CCCCCCCCCCCCCCCC
-A KUBE-EXT-CCCCCCCCCCCCCCCC -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A CNI-KEEP -j KUBE-MARK-DROP
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -j DROP
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
`

// kubeProxyNFT is what kube-proxy's nftables mode leaves (abridged), plus
// a table of someone else's.
const kubeProxyNFT = `table ip kube-proxy {
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }
	map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }
}
table ip6 kube-proxy {
	chain nat-output { type nat hook output priority -100; policy accept; }
}
table inet someone-else {
	chain c { type filter hook input priority 0; policy accept; }
}
`

// inNetns runs fn on a thread switched into ns; fn does not run unless
// the switch is proven.
func inNetns(t *testing.T, ns *testNetns, fn func()) {
	t.Helper()
	if err := ns.Do(func() error { fn(); return nil }); err != nil {
		t.Error(err)
	}
}

func TestCleanupKubeProxyLeftovers(t *testing.T) {
	for _, bin := range []string{"nft", "iptables-nft-restore", "iptables-nft-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s (Debian: iproute2, nftables, iptables): %v", bin, err)
		}
	}
	n := newTestNetns(t, "ohlo-")
	nsExec := func(stdin string, args ...string) string {
		t.Helper()
		return n.exec(t, stdin, args...)
	}
	// kube-proxy's iptables rules in the nft variant and, where the kernel
	// has it, the legacy one; its nftables tables.
	variants := []string{"nft"}
	nsExec(kubeProxyRuleset, "iptables-nft-restore")
	if _, err := exec.LookPath("iptables-legacy-restore"); err == nil {
		cmd := n.Command("iptables-legacy-restore")
		cmd.Stdin = strings.NewReader(kubeProxyRuleset)
		if out, err := cmd.CombinedOutput(); err == nil {
			variants = append(variants, "legacy")
		} else {
			t.Logf("iptables-legacy unusable here, testing nft only: %v: %s", err, out)
		}
	}
	nsExec(kubeProxyNFT, "nft", "-f", "-")

	ns := n
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	var removed []string
	var cleanupErr error
	inNetns(t, ns, func() { removed, cleanupErr = cleanupKubeProxyLeftovers(context.Background(), log) })
	if cleanupErr != nil {
		t.Fatalf("cleanup: %v", cleanupErr)
	}
	t.Logf("removed:\n%s", strings.Join(removed, "\n"))
	for _, want := range []string{"nftables table ip kube-proxy", "nftables table ip6 kube-proxy",
		"iptables-nft nat chain KUBE-SVC-AAAAAAAAAAAAAAAA", "iptables-nft filter chain KUBE-FORWARD",
		"iptables-nft mangle chain KUBE-PROXY-CANARY"} {
		if !slices.Contains(removed, want) {
			t.Errorf("removed list lacks %q", want)
		}
	}

	tables := nsExec("", "nft", "list", "tables")
	if strings.Contains(tables, "kube-proxy") || !strings.Contains(tables, "table inet someone-else") {
		t.Errorf("nft tables after cleanup:\n%s", tables)
	}
	for _, v := range variants {
		saved := nsExec("", "iptables-"+v+"-save")
		for _, line := range strings.Split(saved, "\n") {
			for _, gone := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-NODEPORTS",
				"KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-FORWARD", "KUBE-EXTERNAL-SERVICES",
				"KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"} {
				if strings.Contains(line, gone) {
					t.Errorf("%s: left behind: %s", v, line)
				}
			}
		}
		for _, kept := range []string{
			":KUBE-FIREWALL", ":KUBE-MARK-DROP", ":KUBE-KUBELET-CANARY", ":CNI-KEEP",
			"-A PREROUTING -j CNI-KEEP", "-A POSTROUTING -s 10.244.0.0/16 -j MASQUERADE",
			"-A CNI-KEEP -j KUBE-MARK-DROP", "-A INPUT -j KUBE-FIREWALL", "-A OUTPUT -j KUBE-FIREWALL",
			"-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -j DROP",
		} {
			if !strings.Contains(saved, kept) {
				t.Errorf("%s: removed what is not kube-proxy's: %q\n%s", v, kept, saved)
			}
		}
	}

	// Again: nothing left to remove, no error.
	inNetns(t, ns, func() { removed, cleanupErr = cleanupKubeProxyLeftovers(context.Background(), log) })
	if cleanupErr != nil || len(removed) != 0 {
		t.Errorf("second cleanup: removed %q, err %v; want nothing", removed, cleanupErr)
	}
}
