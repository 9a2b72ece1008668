package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// render writes the plan for people and golden files: ipvsadm-like virtual
// servers, then the iptables rules per chain.
func (pl *plan) render(cfg dataplane.Config, randomFully bool) string {
	var b strings.Builder
	b.WriteString(renderServers(pl.Servers, false))
	for _, fam := range []portal.Family{portal.IPv4, portal.IPv6} {
		fmt.Fprintf(&b, "\n# %s nat %s\n", fam, chainPostrouting)
		for _, r := range postroutingRules(cfg, fam, randomFully) {
			fmt.Fprintf(&b, "-A %s %s\n", chainPostrouting, strings.Join(r, " "))
		}
		fmt.Fprintf(&b, "# %s filter %s\n", fam, chainFilter)
		for _, r := range filterRules(fam) {
			fmt.Fprintf(&b, "-A %s %s\n", chainFilter, strings.Join(r, " "))
		}
		for _, line := range pl.ruleLines(fam) {
			b.WriteString(line)
		}
	}
	var vips []string
	for a := range pl.VIPs {
		vips = append(vips, a.String())
	}
	slices.Sort(vips)
	fmt.Fprintf(&b, "\n# addresses on %s\n%s\n", DummyInterface, strings.Join(vips, "\n"))
	for _, c := range pl.Conflicts {
		fmt.Fprintf(&b, "# conflict: %s\n", c)
	}
	return b.String()
}

func (pl *plan) ruleLines(fam portal.Family) []string {
	var lines []string
	for _, r := range pl.Rules {
		if r.Family == fam {
			lines = append(lines, fmt.Sprintf("%s -A %s %s\n", r.Table, r.Chain, strings.Join(r.Spec, " ")))
		}
	}
	slices.Sort(lines)
	for _, name := range sortedKeys(pl.Sets) {
		if c := pl.Sets[name]; c.Family == fam {
			lines = append(lines, fmt.Sprintf("ipset %s hash:net %s\n", name, strings.Join(prefixStrings(c.Nets), " ")))
		}
	}
	return lines
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// renderServers writes virtual servers like `ipvsadm -Ln`, sorted; with
// labels, each line names the Service port it belongs to.
func renderServers(servers map[vsKey]*virtualServer, withCounters bool) string {
	vs := make([]*virtualServer, 0, len(servers))
	for _, v := range servers {
		vs = append(vs, v)
	}
	slices.SortFunc(vs, func(a, b *virtualServer) int {
		return cmp.Or(cmp.Compare(a.Key.Proto, b.Key.Proto), a.Key.Addr.Compare(b.Key.Addr), cmp.Compare(a.Key.Port, b.Key.Port))
	})
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "%s %s", v.Key, v.Sched)
		if v.Timeout > 0 {
			fmt.Fprintf(&b, " persistent %d", v.Timeout)
		}
		if v.Fallback {
			b.WriteString(" fallback")
		}
		if v.Portal.Service.Name != "" {
			fmt.Fprintf(&b, "  # %s %s", v.Portal, v.Kind)
		}
		b.WriteString("\n")
		ds := make([]netip.AddrPort, 0, len(v.Dests))
		for d := range v.Dests {
			ds = append(ds, d)
		}
		slices.SortFunc(ds, netip.AddrPort.Compare)
		for _, d := range ds {
			fmt.Fprintf(&b, "  -> %s Masq %d\n", d, v.Dests[d])
		}
	}
	return b.String()
}
