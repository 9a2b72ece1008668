package external

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
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

// announcer answers, for one round of the providers, which node may
// announce which address under the advertisements.
type announcer struct {
	rules *adRules
	// poolOf names the pool of an address ("" for none); nodeLabels are a
	// node's labels.
	poolOf     func(netip.Addr) string
	nodeLabels func(string) labels.Set
}

// allows reports whether one advertisement of ads picks ip and node; with
// none, every pair is picked.
func (a *announcer) allows(ads []adRule, ip netip.Addr, node string) bool {
	if a == nil || a.rules == nil || len(ads) == 0 {
		return true
	}
	pool, nl := a.poolOf(ip), a.nodeLabels(node)
	for i := range ads {
		if ads[i].selectsNode(nl) && ads[i].selectsAddress(pool, a.rules.poolLabels) {
			return true
		}
	}
	return false
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
