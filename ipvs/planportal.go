package ipvs

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/onehop/onehop/portal"
)

// addPortal adds what p asks for (virtual servers, VIPs, iptables rules,
// source-range sets) to the plan, and records it in pt.
func (pl *plan) addPortal(in planInput, p *portal.Portal, pt *part) {
	fam := p.Key.Family
	mark := in.Cfg.MasqueradeMark()
	internal := p.ClusterEndpoints
	if p.InternalLocal {
		internal = p.LocalEndpoints
	}
	external := p.ClusterEndpoints
	if p.ExternalLocal {
		external = p.LocalEndpoints
	}
	var timeout uint32
	if p.Affinity.TimeoutSeconds > 0 {
		timeout = p.Affinity.TimeoutSeconds
	}
	local := make([]string, 0, len(p.LocalEndpoints))
	for _, e := range p.LocalEndpoints {
		local = append(local, e.String())
	}
	pl.Local[p.Key.String()] = local
	if p.Topology != "" {
		pl.Topology[p.Key.String()] = p.Topology
	}
	pt.Local = append(pt.Local, p.Key.String())

	add := func(addr netip.Addr, port uint16, kind string, eps []netip.AddrPort) bool {
		if portal.FamilyOf(addr) != fam || !addr.IsValid() {
			return false
		}
		addr = addr.Unmap()
		k := vsKey{Proto: p.Key.Protocol, Addr: addr, Port: port}
		if old, ok := pl.Servers[k]; ok {
			pl.Conflicts = append(pl.Conflicts, fmt.Sprintf("%s %s: already used by %s", p.Key, k, old.Portal))
			pl.Losers[p.Key.Service] = true
			return false
		}
		d := make(map[netip.AddrPort]int, len(eps))
		for _, e := range eps {
			d[netip.AddrPortFrom(e.Addr().Unmap(), e.Port())] = 1
		}
		sched := in.Sched
		if p.Scheduler != "" && !in.Refused[p.Scheduler] {
			sched = p.Scheduler // onehop.io/scheduler on the Service
		}
		pl.Servers[k] = &virtualServer{Key: k, Sched: sched, Timeout: timeout, Fallback: hashing(sched), Dests: d, Portal: p.Key, Kind: kind}
		pt.Servers = append(pt.Servers, k)
		return true
	}
	type ext struct {
		addr netip.Addr
		port uint16
		kind string
	}
	var exts []ext
	for _, ip := range p.ClusterIPs {
		if add(ip, p.Port, kindClusterIP, internal) {
			pl.addVIP(ip.Unmap(), pt)
		}
	}
	for _, ip := range p.ExternalIPs {
		if add(ip, p.Port, kindExternalIP, external) {
			pl.addVIP(ip.Unmap(), pt)
			exts = append(exts, ext{ip.Unmap(), p.Port, kindExternalIP})
		}
	}
	for _, ip := range p.LoadBalancerIPs {
		if add(ip, p.Port, kindLoadBalancer, external) {
			pl.addVIP(ip.Unmap(), pt)
			exts = append(exts, ext{ip.Unmap(), p.Port, kindLoadBalancer})
			if p.HealthCheckNodePort != 0 {
				pl.addAllowed(vsKey{Proto: portal.TCP, Addr: ip.Unmap(), Port: p.HealthCheckNodePort}, pt)
			}
		}
	}
	if p.NodePort != 0 {
		for _, ip := range in.NodeAddrs {
			if add(ip, p.NodePort, kindNodePort, external) {
				exts = append(exts, ext{ip.Unmap(), p.NodePort, kindNodePort})
			}
		}
	}

	comment := []string{"-m", "comment", "--comment", p.Key.String()}
	for _, e := range exts {
		match := ipvsMatch(p.Key.Protocol, e.addr, e.port)
		switch {
		case p.ExternalLocal:
			// Local policy: the endpoint must see the client's address.
			pl.addPartRule(rule{fam, "nat", chainKeepSource, concat(match, comment, markClear(mark))}, pt)
		case len(in.Cfg.ClusterCIDRs) == 0 && !in.Cfg.MasqueradeAll:
			// Nothing masquerades by default: external traffic under the
			// Cluster policy must, or replies from other nodes bypass us.
			pl.addPartRule(rule{fam, "nat", chainMasqExt, concat(match, comment, markSet(mark))}, pt)
		}
		if len(p.SourceRanges) > 0 && (e.kind == kindLoadBalancer || (e.kind == kindNodePort && in.Cfg.SourceRangesOnNodePorts)) {
			// One set lookup per entry, whatever the number of ranges:
			// packets from outside the Service's set are dropped.
			set := pl.addRangeSet(p, pt)
			notInSet := []string{"-m", "set", "!", "--match-set", set, "src", "-j", "DROP"}
			pl.addPartRule(rule{fam, "filter", chainInput, concat(destMatch(p.Key.Protocol, e.addr, e.port), comment, notInSet)}, pt)
			if !anyInRanges(in.NodeAddrs, p.SourceRanges) {
				// The node's own connections never pass INPUT: IPVS takes
				// them at LOCAL_OUT, and OUTPUT sees them scheduled. The
				// set match keeps the packets of allowed clients, which
				// IPVS sends out through OUTPUT too.
				pl.addPartRule(rule{fam, "filter", chainOutput, concat(ipvsMatch(p.Key.Protocol, e.addr, e.port), comment, notInSet)}, pt)
			}
		}
	}
	// Hairpin: an endpoint on this node reaching itself through the Service
	// must see the node as source, or it would answer itself directly. The
	// model lists this node's endpoints among the chosen ones in Hairpin
	// (LocalEndpoints only under a Local policy).
	hairpin := slices.Clone(p.Hairpin)
	for _, e := range p.LocalEndpoints {
		hairpin = append(hairpin, e.Addr())
	}
	for _, a := range hairpin {
		a = a.Unmap()
		if portal.FamilyOf(a) != fam {
			continue
		}
		pfx := netip.PrefixFrom(a, a.BitLen()).String()
		pl.addPartRule(rule{fam, "nat", chainHairpin, []string{"-s", pfx, "-d", pfx, "-j", "MARK", "--set-xmark", hexMark(mark, mark)}}, pt)
	}
}

// anyInRanges reports whether one of the node's addresses is inside one of
// the source ranges: then the node may reach the Service (as kube-proxy).
func anyInRanges(node []netip.Addr, ranges []netip.Prefix) bool {
	for _, a := range node {
		for _, r := range ranges {
			if r.IsValid() && r.Masked().Contains(a.Unmap()) {
				return true
			}
		}
	}
	return false
}

// hashing reports whether sched picks a destination by hashing the client
// (source or Maglev hashing). Without the fallback flag they refuse a
// client whose destination is at weight 0, and a draining destination keeps
// its share of the hash table until it is deleted.
func hashing(sched string) bool { return sched == "sh" || sched == "mh" }
