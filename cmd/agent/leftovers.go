package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
)

// kubeProxyNFTTable is the table kube-proxy's nftables mode owns, in the ip
// and ip6 families.
const kubeProxyNFTTable = "kube-proxy"

// kubeProxyChains are the iptables chains kube-proxy's iptables and IPVS
// modes create, by table; kubeProxyChainPrefixes name its per-Service and
// per-endpoint chains. Chains the kubelet owns (KUBE-FIREWALL,
// KUBE-KUBELET-CANARY, KUBE-MARK-DROP, KUBE-IPTABLES-HINT) are not listed
// and are left alone, as is every chain of anyone else.
var (
	kubeProxyChains = map[string][]string{
		"nat": {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ",
			"KUBE-PROXY-CANARY", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"},
		"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS",
			"KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY", "KUBE-NODE-PORT",
			"KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
		"mangle": {"KUBE-PROXY-CANARY"},
	}
	kubeProxyChainPrefixes = map[string][]string{
		"nat": {"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-", "KUBE-XLB-"},
	}
)

// isKubeProxyChain reports whether kube-proxy owns chain in table.
func isKubeProxyChain(table, chain string) bool {
	for _, c := range kubeProxyChains[table] {
		if c == chain {
			return true
		}
	}
	for _, p := range kubeProxyChainPrefixes[table] {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// cleanupKubeProxyLeftovers removes, from the calling thread's network
// namespace, what a kube-proxy that ran before onehop left behind: its
// nftables tables (ip and ip6 "kube-proxy") and its iptables chains with
// the rules that jump to them, in every iptables variant found on PATH
// (iptables-nft and iptables-legacy, IPv4 and IPv6). It touches nothing
// else: other tables, other chains, and the kubelet's KUBE-* chains stay.
// It returns what it removed; running it again removes nothing. Without an
// iptables binary (the nftables image) it removes the nftables tables and
// says in the error that iptables leftovers were not looked at.
//
// Not removed: kube-proxy's IPVS virtual servers, its kube-ipvs0 dummy
// link and its KUBE-* ipsets (the migration guide has the commands).
func cleanupKubeProxyLeftovers(ctx context.Context, log *slog.Logger) ([]string, error) {
	var removed []string
	var errs []error

	r, err := cleanupKubeProxyNFT()
	removed = append(removed, r...)
	if err != nil {
		errs = append(errs, err)
	}

	variants := leftoverIPTablesVariants()
	if len(variants) == 0 {
		errs = append(errs, errors.New("no iptables binary on PATH: kube-proxy's iptables chains (if any) were not looked at"))
	}
	for _, v := range variants {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		ipt, err := iptables.New(iptables.Path(v.path), iptables.IPFamily(v.proto), iptables.Timeout(5))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v.path, err))
			continue
		}
		for _, table := range []string{"nat", "filter", "mangle"} {
			r, err := cleanupKubeProxyIPTablesTable(ipt, filepath.Base(v.path), table, log)
			removed = append(removed, r...)
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, what := range removed {
		log.InfoContext(ctx, "removed kube-proxy leftover", "what", what)
	}
	return removed, errors.Join(errs...)
}

// cleanupKubeProxyNFT deletes the ip and ip6 kube-proxy tables, in one
// transaction, when they exist.
func cleanupKubeProxyNFT() ([]string, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	var removed []string
	for _, fam := range []struct {
		family nftables.TableFamily
		name   string
	}{{nftables.TableFamilyIPv4, "ip"}, {nftables.TableFamilyIPv6, "ip6"}} {
		tables, err := conn.ListTablesOfFamily(fam.family)
		if err != nil {
			return nil, fmt.Errorf("nftables: list %s tables: %w", fam.name, err)
		}
		for _, t := range tables {
			if t.Name == kubeProxyNFTTable {
				conn.DelTable(t)
				removed = append(removed, fmt.Sprintf("nftables table %s %s", fam.name, t.Name))
			}
		}
	}
	if len(removed) == 0 {
		return nil, nil
	}
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: delete kube-proxy tables: %w", err)
	}
	return removed, nil
}

// leftoverIPTablesVariant is one iptables binary to clean with.
type leftoverIPTablesVariant struct {
	path  string
	proto iptables.Protocol
}

// leftoverIPTablesVariants finds the iptables binaries on PATH: both the
// nft and the legacy variant where they exist (kube-proxy may have used
// either), else plain iptables/ip6tables.
func leftoverIPTablesVariants() []leftoverIPTablesVariant {
	var out []leftoverIPTablesVariant
	for _, fam := range []struct {
		base  string
		proto iptables.Protocol
	}{{"iptables", iptables.ProtocolIPv4}, {"ip6tables", iptables.ProtocolIPv6}} {
		n := len(out)
		for _, name := range []string{fam.base + "-nft", fam.base + "-legacy"} {
			if p, err := exec.LookPath(name); err == nil {
				out = append(out, leftoverIPTablesVariant{path: p, proto: fam.proto})
			}
		}
		if len(out) == n {
			if p, err := exec.LookPath(fam.base); err == nil {
				out = append(out, leftoverIPTablesVariant{path: p, proto: fam.proto})
			}
		}
	}
	return out
}

// cleanupKubeProxyIPTablesTable removes kube-proxy's chains from one table:
// first the rules elsewhere that jump to them, then their rules, then the
// chains. A table that cannot be listed (not in this kernel, or this
// variant unused) holds nothing to remove.
func cleanupKubeProxyIPTablesTable(ipt *iptables.IPTables, variant, table string, log *slog.Logger) ([]string, error) {
	chains, err := ipt.ListChains(table)
	if err != nil {
		log.Debug("cannot list iptables table; skipping", "variant", variant, "table", table, "err", err)
		return nil, nil
	}
	owned := map[string]bool{}
	for _, c := range chains {
		if isKubeProxyChain(table, c) {
			owned[c] = true
		}
	}
	if len(owned) == 0 {
		return nil, nil
	}
	var removed []string
	var errs []error
	where := func(s string) string { return fmt.Sprintf("%s %s %s", variant, table, s) }
	for _, c := range chains {
		if owned[c] {
			continue
		}
		rules, err := ipt.List(table, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where("list "+c), err))
			continue
		}
		for _, rule := range rules {
			args, err := leftoverSplitRule(rule)
			if err != nil || len(args) < 2 || args[0] != "-A" {
				continue
			}
			if target := leftoverRuleTarget(args); !owned[target] {
				continue
			}
			if err := ipt.Delete(table, c, args[2:]...); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where("delete rule "+rule), err))
				continue
			}
			removed = append(removed, where("rule "+rule))
		}
	}
	// Flush all first: kube-proxy's chains jump to each other.
	for c := range owned {
		if err := ipt.ClearChain(table, c); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where("flush "+c), err))
		}
	}
	for _, c := range chains {
		if !owned[c] {
			continue
		}
		if err := ipt.DeleteChain(table, c); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where("delete chain "+c), err))
			continue
		}
		removed = append(removed, where("chain "+c))
	}
	return removed, errors.Join(errs...)
}

// leftoverRuleTarget is the chain a rule's -j or -g names, or "".
func leftoverRuleTarget(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" || args[i] == "--jump" || args[i] == "--goto" {
			return args[i+1]
		}
	}
	return ""
}

// leftoverSplitRule splits a line of `iptables -S` output into arguments:
// words separated by spaces, where double quotes group (as iptables prints
// comments) and a backslash escapes the next character inside them.
func leftoverSplitRule(line string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inWord, inQuote := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			inQuote = !inQuote
			inWord = true
		case !inQuote && (c == ' ' || c == '\t'):
			if inWord {
				args = append(args, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inWord {
		args = append(args, cur.String())
	}
	return args, nil
}
