package external

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/ipam"
)

// adRule is an accepted BGPAdvertisement or L2Advertisement: which
// addresses it picks (pools by name or label; neither: every address),
// from which nodes (no selector: every node), and for L2 on which
// interfaces.
type adRule struct {
	name       string
	pools      []string
	poolSel    []labels.Selector
	nodes      []labels.Selector
	interfaces []string
	pattern    string
	// route is what a BGP advertisement puts on its routes.
	route routeAttrs
}

// routeAttrs are a BGPAdvertisement's route attributes: the prefix
// lengths an address is announced with (agg4 and agg6; 0 stands for the
// address alone), and the communities and LOCAL_PREF.
type routeAttrs struct {
	agg4, agg6  int
	communities []uint32
	large       []bgp.LargeCommunity
	localPref   *uint32
}

// aggregates reports whether the attributes announce some address as a
// prefix wider than itself.
func (r *routeAttrs) aggregates() bool {
	return (r.agg4 != 0 && r.agg4 != 32) || (r.agg6 != 0 && r.agg6 != 128)
}

// of is the route of ip under the attributes.
func (r *routeAttrs) of(ip netip.Addr) bgp.Route {
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

// adRules are the accepted advertisements of each kind. No advertisement
// of a kind leaves its provider as the file configures it: every address,
// from every node that runs it.
type adRules struct {
	bgp, l2 []adRule
	// poolLabels are every pool object's labels, for poolSel.
	poolLabels map[string]labels.Set
}

func (r *adRule) selectsNode(l labels.Set) bool {
	return len(r.nodes) == 0 || slices.ContainsFunc(r.nodes, func(s labels.Selector) bool { return s.Matches(l) })
}

// selectsAddress: pool is the address's pool, "" for one in no pool.
func (r *adRule) selectsAddress(pool string, poolLabels map[string]labels.Set) bool {
	if len(r.pools) == 0 && len(r.poolSel) == 0 {
		return true
	}
	if pool == "" {
		return false
	}
	return slices.Contains(r.pools, pool) ||
		slices.ContainsFunc(r.poolSel, func(s labels.Selector) bool { return s.Matches(poolLabels[pool]) })
}

// selectsAny: the advertisement picks one of pools (an address a Service
// keeps outside every pool counts in each pool it may have come from).
func (r *adRule) selectsAny(pools []string, poolLabels map[string]labels.Set) bool {
	if len(pools) == 0 {
		return r.selectsAddress("", poolLabels)
	}
	return slices.ContainsFunc(pools, func(p string) bool { return r.selectsAddress(p, poolLabels) })
}

// announcer answers, for one round of the providers, which node may
// announce which address under the advertisements.
type announcer struct {
	rules *adRules
	// poolOf names the pool of an address ("" for none); nodeLabels are a
	// node's labels.
	poolOf     func(netip.Addr) string
	nodeLabels func(string) labels.Set
	// kept names, for an address a Service keeps outside every pool (a
	// pool shrank under it), the pools it may have come from; nil: none.
	kept map[netip.Addr][]string
}

// poolsOf are the pools an advertisement may pick ip by, and whether ip
// is in one of them (not kept outside all).
func (a *announcer) poolsOf(ip netip.Addr) ([]string, bool) {
	if p := a.poolOf(ip); p != "" {
		return []string{p}, true
	}
	return a.kept[ip.Unmap()], false
}

// allows reports whether one advertisement of ads picks ip and node; with
// none, every pair is picked.
func (a *announcer) allows(ads []adRule, ip netip.Addr, node string) bool {
	if a == nil || a.rules == nil || len(ads) == 0 {
		return true
	}
	pools, _ := a.poolsOf(ip)
	nl := a.nodeLabels(node)
	for i := range ads {
		if ads[i].selectsNode(nl) && ads[i].selectsAny(pools, a.rules.poolLabels) {
			return true
		}
	}
	return false
}

// bgpRoutes are the routes node announces for ip over BGP: one per
// advertisement that picks both (SetRoutes merges those of one prefix),
// the host route with no attributes when there is no advertisement, and
// none when advertisements exist and none picks the pair.
func (a *announcer) bgpRoutes(ip netip.Addr, node string) []bgp.Route {
	if a == nil || a.rules == nil || len(a.rules.bgp) == 0 {
		return []bgp.Route{bgp.HostRoute(ip)}
	}
	pools, inPool := a.poolsOf(ip)
	nl := a.nodeLabels(node)
	var out []bgp.Route
	for i := range a.rules.bgp {
		if r := &a.rules.bgp[i]; r.selectsNode(nl) && r.selectsAny(pools, a.rules.poolLabels) {
			route := r.route.of(ip)
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

// bgpAllows reports whether node may announce ip over BGP.
func (a *announcer) bgpAllows(ip netip.Addr, node string) bool {
	if a == nil || a.rules == nil {
		return true
	}
	return a.allows(a.rules.bgp, ip, node)
}

// l2Allows reports whether node may answer for ip (and so be its L2 owner).
func (a *announcer) l2Allows(ip netip.Addr, node string) bool {
	if a == nil || a.rules == nil {
		return true
	}
	return a.allows(a.rules.l2, ip, node)
}

// l2PicksIP says which L2 advertisements pick ip by its pools, a byte
// each ('1' picks); "" when none limits L2 (every node may answer for
// every address). l2PicksNode says which pick node by its labels.
// l2Allows(ip, node) is true exactly when the two share a '1'
// (picksShared): the owner index (l2owners.go) groups addresses by the
// first and nodes by the second, and weighs no pair.
func (a *announcer) l2PicksIP(ip netip.Addr) string {
	if a == nil || a.rules == nil || len(a.rules.l2) == 0 {
		return ""
	}
	pools, _ := a.poolsOf(ip)
	b := make([]byte, len(a.rules.l2))
	for i := range a.rules.l2 {
		b[i] = pick(a.rules.l2[i].selectsAny(pools, a.rules.poolLabels))
	}
	return string(b)
}

func (a *announcer) l2PicksNode(node string) string {
	if a == nil || a.rules == nil || len(a.rules.l2) == 0 {
		return ""
	}
	nl := a.nodeLabels(node)
	b := make([]byte, len(a.rules.l2))
	for i := range a.rules.l2 {
		b[i] = pick(a.rules.l2[i].selectsNode(nl))
	}
	return string(b)
}

func pick(ok bool) byte {
	if ok {
		return '1'
	}
	return '0'
}

// picksShared: an address picked by ipPicks may be answered for by a node
// picked by nodePicks (both from the same advertisements).
func picksShared(ipPicks, nodePicks string) bool {
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

// announcer of the configuration's advertisements (nil without any
// custom resources: everything is announced).
func (p *parsed) announcer(nodeLabels func(string) labels.Set) *announcer {
	if p.ads == nil {
		return nil
	}
	return &announcer{rules: p.ads, nodeLabels: nodeLabels, poolOf: func(ip netip.Addr) string {
		for i := range p.pools {
			if p.pools[i].Contains(ip) {
				return p.pools[i].Name
			}
		}
		return ""
	}}
}

// keptPools names, for each address a Service keeps outside every pool,
// the pools it may have come from: the pool its annotation names, else
// every pool that admits the Service (its namespace and labels). A
// pool-picking advertisement keeps announcing such an address as long as
// it picks one of them, so that shrinking a pool does not take a Service's
// address off the air (the Service has an IPOutsidePools event). Without
// advertisements nothing is needed: every address is announced.
func (p *parsed) keptPools(services []*corev1.Service) map[netip.Addr][]string {
	if p.ads == nil || len(p.ads.bgp)+len(p.ads.l2) == 0 {
		return nil
	}
	var out map[netip.Addr][]string
	for _, svc := range services {
		if !p.managed(svc) {
			continue
		}
		for _, ip := range statusIPs(svc) {
			if slices.ContainsFunc(p.pools, func(pl ipam.Pool) bool { return pl.Contains(ip) }) {
				continue
			}
			_, named, _ := annotation(svc, AnnotationAddressPool)
			named = strings.TrimSpace(named)
			for i := range p.pools {
				pl := &p.pools[i]
				if named != "" && pl.Name != named || named == "" && !pl.Admits(svc.Namespace, svc.Labels) {
					continue
				}
				if out == nil {
					out = map[netip.Addr][]string{}
				}
				if !slices.Contains(out[ip], pl.Name) {
					out[ip] = append(out[ip], pl.Name)
				}
			}
		}
	}
	return out
}
