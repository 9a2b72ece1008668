package ipvs

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// rule is one iptables rule in a chain onehop owns. Spec is written in the
// canonical form `iptables -S` prints it, so that a full sync can compare
// the kernel's listing with the plan.
type rule struct {
	Family portal.Family
	Table  string
	Chain  string
	Spec   []string
}

func (r rule) key() string {
	return fmt.Sprintf("%s %s %s %s", r.Family, r.Table, r.Chain, strings.Join(r.Spec, " "))
}

// Chains onehop owns. Everything it creates starts with chainPrefix.
const (
	chainPrefix      = "ONEHOP-"
	chainPostrouting = "ONEHOP-IPVS-POSTROUTING" // nat: decides masquerade for IPVS traffic
	chainMasqExt     = "ONEHOP-IPVS-MASQ-EXT"    // nat: external entries that masquerade when nothing else does
	chainKeepSource  = "ONEHOP-IPVS-KEEP-SOURCE" // nat: Local-policy external entries keep the client address
	chainHairpin     = "ONEHOP-IPVS-HAIRPIN"     // nat: an endpoint reaching itself through a Service
	chainInput       = "ONEHOP-IPVS-INPUT"       // filter: source ranges
	chainOutput      = "ONEHOP-IPVS-OUTPUT"      // filter: source ranges, for the node's own traffic
	srChainPrefix    = "ONEHOP-SR-"              // filter: a chain per entry, from versions before the ipsets; removed
	rangeSetPrefix   = "ONEHOP-RANGES-"          // ipset hash:net: a Service's source ranges in one family
	jumpComment      = "onehop-ipvs"
)

type srChain struct {
	Family portal.Family
	Rules  [][]string
}

func (pl *plan) addRule(r rule) { pl.Rules[r.key()] = r }

// ipvsMatch matches packets IPVS scheduled through virtual server addr:port,
// as `iptables -S` prints it.
func ipvsMatch(proto portal.Protocol, addr netip.Addr, port uint16) []string {
	return []string{"-m", "ipvs", "--vproto", fmt.Sprint(uint8(proto)), "--vaddr", addr.String(), "--vport", fmt.Sprint(port), "--vdir", "ORIGINAL"}
}

// destMatch matches packets to addr:port before IPVS sees them.
func destMatch(proto portal.Protocol, addr netip.Addr, port uint16) []string {
	p := proto.String()
	return []string{"-d", netip.PrefixFrom(addr, addr.BitLen()).String(), "-p", p, "-m", p, "--dport", fmt.Sprint(port)}
}

func markSet(mark uint32) []string   { return []string{"-j", "MARK", "--set-xmark", hexMark(mark, mark)} }
func markClear(mark uint32) []string { return []string{"-j", "MARK", "--set-xmark", hexMark(0, mark)} }
func hexMark(v, m uint32) string     { return fmt.Sprintf("%#x/%#x", v, m) }

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// postroutingRules is the fixed, ordered content of ONEHOP-IPVS-POSTROUTING:
// the mark bit is set when the packet should be masqueraded, cleared when it
// must keep its source, and the last rules masquerade what is still marked.
func postroutingRules(cfg dataplane.Config, fam portal.Family, randomFully bool) [][]string {
	mark := cfg.MasqueradeMark()
	rs := [][]string{{"-m", "ipvs", "!", "--ipvs", "-j", "RETURN"}}
	if cfg.MasqueradeAll || len(cfg.ClusterCIDRs) > 0 {
		rs = append(rs, markSet(mark))
	}
	if !cfg.MasqueradeAll {
		for _, c := range cfg.ClusterCIDRs {
			if c.Addr().Is4() == (fam == portal.IPv4) {
				rs = append(rs, concat([]string{"-s", c.Masked().String()}, markClear(mark)))
			}
		}
	}
	rs = append(rs,
		[]string{"-j", chainMasqExt},
		[]string{"-j", chainKeepSource},
		[]string{"-j", chainHairpin},
		[]string{"-m", "mark", "!", "--mark", hexMark(mark, mark), "-j", "RETURN"},
		markClear(mark))
	masq := []string{"-j", "MASQUERADE"}
	if randomFully {
		masq = append(masq, "--random-fully")
	}
	return append(rs, masq)
}
