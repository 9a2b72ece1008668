package config

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/external/bgp"
)

// AdRule is an accepted BGPAdvertisement or L2Advertisement: which
// addresses it picks (Pools by name or PoolSelectors by label; neither:
// every address), from which Nodes (no selector: every node), and for L2
// on which interfaces (Interfaces, and those Pattern matches).
type AdRule struct {
	Name          string
	Pools         []string
	PoolSelectors []labels.Selector
	Nodes         []labels.Selector
	Interfaces    []string
	Pattern       string
	// Route is what a BGP advertisement puts on its routes.
	Route RouteAttrs
}

// RouteAttrs are a BGPAdvertisement's route attributes: the prefix
// lengths an address is announced with (agg4 and agg6; 0 stands for the
// address alone), and the communities and LOCAL_PREF.
type RouteAttrs struct {
	agg4, agg6  int
	communities []uint32
	large       []bgp.LargeCommunity
	localPref   *uint32
}

// aggregates reports whether the attributes announce some address as a
// prefix wider than itself.
func (r *RouteAttrs) aggregates() bool {
	return (r.agg4 != 0 && r.agg4 != 32) || (r.agg6 != 0 && r.agg6 != 128)
}

// of is the route of ip under the attributes.
func (r *RouteAttrs) of(ip netip.Addr) bgp.Route {
	ip = ip.Unmap()
	bits, l := ip.BitLen(), r.agg4
	if ip.Is6() {
		l = r.agg6
	}
	if l != 0 {
		bits = l
	}
	return bgp.Route{Prefix: netip.PrefixFrom(ip, bits).Masked(), Communities: r.communities,
		LargeCommunities: r.large, LocalPref: r.localPref}
}

// AdRules are the accepted advertisements of each kind. No advertisement
// of a kind leaves its provider as the file configures it: every address,
// from every node that runs it.
type AdRules struct {
	BGP, L2 []AdRule
	// PoolLabels are every pool object's labels, for PoolSelectors.
	PoolLabels map[string]labels.Set
}

func (r *AdRule) selectsNode(l labels.Set) bool {
	return len(r.Nodes) == 0 || slices.ContainsFunc(r.Nodes, func(s labels.Selector) bool { return s.Matches(l) })
}

// selectsAddress: pool is the address's pool, "" for one in no pool.
func (r *AdRule) selectsAddress(pool string, poolLabels map[string]labels.Set) bool {
	if len(r.Pools) == 0 && len(r.PoolSelectors) == 0 {
		return true
	}
	if pool == "" {
		return false
	}
	return slices.Contains(r.Pools, pool) ||
		slices.ContainsFunc(r.PoolSelectors, func(s labels.Selector) bool { return s.Matches(poolLabels[pool]) })
}

// selectsAny: the advertisement picks one of pools (an address a Service
// keeps outside every pool counts in each pool it may have come from).
func (r *AdRule) selectsAny(pools []string, poolLabels map[string]labels.Set) bool {
	if len(pools) == 0 {
		return r.selectsAddress("", poolLabels)
	}
	return slices.ContainsFunc(pools, func(p string) bool { return r.selectsAddress(p, poolLabels) })
}

// Announcer answers, for one round of the providers, which node may
// announce which address under the advertisements. Its methods answer for
// a nil Announcer too: everything is announced.
type Announcer struct {
	rules *AdRules
	// poolOf names the pool of an address ("" for none); nodeLabels are a
	// node's labels.
	poolOf     func(netip.Addr) string
	nodeLabels func(string) labels.Set
	// Kept names, for an address a Service keeps outside every pool (a
	// pool shrank under it), the pools it may have come from; nil: none.
	Kept map[netip.Addr][]string
}

// NewAnnouncer applies rules, poolOf naming the pool of an address ("" for
// none) and nodeLabels giving a node's labels.
func NewAnnouncer(rules *AdRules, poolOf func(netip.Addr) string, nodeLabels func(string) labels.Set) *Announcer {
	return &Announcer{rules: rules, poolOf: poolOf, nodeLabels: nodeLabels}
}

// poolsOf are the pools an advertisement may pick ip by, and whether ip
// is in one of them (not kept outside all).
func (a *Announcer) poolsOf(ip netip.Addr) ([]string, bool) {
	if p := a.poolOf(ip); p != "" {
		return []string{p}, true
	}
	return a.Kept[ip.Unmap()], false
}

// allows reports whether one advertisement of ads picks ip and node; with
// none, every pair is picked.
func (a *Announcer) allows(ads []AdRule, ip netip.Addr, node string) bool {
	if a == nil || a.rules == nil || len(ads) == 0 {
		return true
	}
	pools, _ := a.poolsOf(ip)
	nl := a.nodeLabels(node)
	for i := range ads {
		if ads[i].selectsNode(nl) && ads[i].selectsAny(pools, a.rules.PoolLabels) {
			return true
		}
	}
	return false
}

// BGPRoutes are the routes node announces for ip over BGP: one per
// advertisement that picks both (SetRoutes merges those of one prefix),
// the host route with no attributes when there is no advertisement, and
// none when advertisements exist and none picks the pair.
func (a *Announcer) BGPRoutes(ip netip.Addr, node string) []bgp.Route {
	if a == nil || a.rules == nil || len(a.rules.BGP) == 0 {
		return []bgp.Route{bgp.HostRoute(ip)}
	}
	pools, inPool := a.poolsOf(ip)
	nl := a.nodeLabels(node)
	var out []bgp.Route
	for i := range a.rules.BGP {
		if r := &a.rules.BGP[i]; r.selectsNode(nl) && r.selectsAny(pools, a.rules.PoolLabels) {
			route := r.Route.of(ip)
			if !inPool {
				// A kept address is announced alone: the prefix around
				// it is no pool's any more.
				route.Prefix = bgp.HostRoute(ip).Prefix
			}
			out = append(out, route)
		}
	}
	return out
}

// BGPAllows reports whether node may announce ip over BGP.
func (a *Announcer) BGPAllows(ip netip.Addr, node string) bool {
	if a == nil || a.rules == nil {
		return true
	}
	return a.allows(a.rules.BGP, ip, node)
}

// L2Allows reports whether node may answer for ip (and so be its L2 owner).
func (a *Announcer) L2Allows(ip netip.Addr, node string) bool {
	if a == nil || a.rules == nil {
		return true
	}
	return a.allows(a.rules.L2, ip, node)
}

// L2PicksIP says which L2 advertisements pick ip by its pools, a byte
// each ('1' picks); "" when none limits L2 (every node may answer for
// every address). L2PicksNode says which pick node by its labels.
// L2Allows(ip, node) is true exactly when the two share a '1'
// (PicksShared): the L2 owner index groups addresses by the first and
// nodes by the second, and weighs no pair.
func (a *Announcer) L2PicksIP(ip netip.Addr) string {
	if a == nil || a.rules == nil || len(a.rules.L2) == 0 {
		return ""
	}
	pools, _ := a.poolsOf(ip)
	b := make([]byte, len(a.rules.L2))
	for i := range a.rules.L2 {
		b[i] = pick(a.rules.L2[i].selectsAny(pools, a.rules.PoolLabels))
	}
	return string(b)
}

// L2PicksNode says which L2 advertisements pick node by its labels (see
// L2PicksIP).
func (a *Announcer) L2PicksNode(node string) string {
	if a == nil || a.rules == nil || len(a.rules.L2) == 0 {
		return ""
	}
	nl := a.nodeLabels(node)
	b := make([]byte, len(a.rules.L2))
	for i := range a.rules.L2 {
		b[i] = pick(a.rules.L2[i].selectsNode(nl))
	}
	return string(b)
}

func pick(ok bool) byte {
	if ok {
		return '1'
	}
	return '0'
}

// PicksShared: an address picked by ipPicks may be answered for by a node
// picked by nodePicks (both from the same advertisements).
func PicksShared(ipPicks, nodePicks string) bool {
	if ipPicks == "" {
		return true
	}
	for i := range min(len(ipPicks), len(nodePicks)) {
		if ipPicks[i] == '1' && nodePicks[i] == '1' {
			return true
		}
	}
	return false
}

// Announcer of the configuration's advertisements (nil without any
// custom resources: everything is announced).
func (p *Parsed) Announcer(nodeLabels func(string) labels.Set) *Announcer {
	if p.ads == nil {
		return nil
	}
	return &Announcer{rules: p.ads, nodeLabels: nodeLabels, poolOf: func(ip netip.Addr) string {
		for i := range p.IPAMPools {
			if p.IPAMPools[i].Contains(ip) {
				return p.IPAMPools[i].Name
			}
		}
		return ""
	}}
}

// Advertises reports whether advertisements are in force: an
// advertisement of either kind picks the addresses its providers
// announce. Without any, every address is announced.
func (p *Parsed) Advertises() bool {
	return p.ads != nil && len(p.ads.BGP)+len(p.ads.L2) > 0
}
