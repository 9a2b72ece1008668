package ipvs

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// Entry kinds, as in dataplane.DumpEntry.
const (
	kindClusterIP    = "cluster-ip"
	kindNodePort     = "node-port"
	kindExternalIP   = "external-ip"
	kindLoadBalancer = "load-balancer"
)

// vsKey names one IPVS virtual server.
type vsKey struct {
	Proto portal.Protocol
	Addr  netip.Addr
	Port  uint16
}

func (k vsKey) String() string {
	return fmt.Sprintf("%s %s", strings.ToUpper(k.Proto.String()), netip.AddrPortFrom(k.Addr, k.Port))
}

func (k vsKey) family() portal.Family { return portal.FamilyOf(k.Addr) }

// virtualServer is the desired (or applied) state of one IPVS service.
type virtualServer struct {
	Key   vsKey
	Sched string
	// Timeout > 0 means persistent (sessionAffinity: ClientIP) for that many seconds.
	Timeout uint32
	// Fallback is set for the hashing schedulers (sh, mh): a client whose
	// hash picks a destination at weight 0 (draining) goes to another one
	// instead of being refused.
	Fallback bool
	// Dests maps each real server to its weight; 0 is draining.
	Dests map[netip.AddrPort]int

	// Labels, not kernel state.
	Portal portal.PortKey
	Kind   string
}

// sameService reports whether the service attributes (not the destinations) match.
func (v *virtualServer) sameService(w *virtualServer) bool {
	return v.Sched == w.Sched && v.Timeout == w.Timeout && v.Fallback == w.Fallback
}

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

// plan is the whole desired state, computed from a snapshot without
// touching the kernel.
type plan struct {
	Servers map[vsKey]*virtualServer
	VIPs    map[netip.Addr]bool
	// Rules are the order-independent rules of the per-entry chains
	// (MASQ-EXT, KEEP-SOURCE, HAIRPIN, INPUT and the SR chains), by key.
	Rules map[string]rule
	// SRChains are source-range chains of older versions, read back from
	// the kernel so that a sync removes them; plans never hold any.
	SRChains map[string]srChain
	// Sets are the source-range ipsets (hash:net), by name.
	Sets map[string]rangeSet
	// Local endpoints per portal, for Dump's local flag.
	Local map[string][]string
	// Topology per portal (portal.Portal.Topology), for Dump: set for the
	// portals in Local that have one.
	Topology map[string]string
	// Allowed are ports of Service IPs that are no virtual server but
	// reach the node: health-check node ports at load-balancer IPs (see
	// filter.go).
	Allowed map[vsKey]bool
	// Filter is what the kernel's filter sets hold, in plans read from
	// the kernel; filterOf(plan) is what they must hold.
	Filter filterState
	// Foreign are the kernel's virtual servers that are not onehop's, in
	// plans read from the kernel.
	Foreign []vsKey
	// Conflicts are entries another Service's portal already claimed.
	Conflicts []string
	// Panics are the Services left out because planning them panicked
	// (by the last buildPlan or replace).
	Panics []dataplane.ServicePanic

	// Parts record what each Service contributed, and the refs count
	// contributions to what Services can share (a VIP, a hairpin rule),
	// so that an incremental sync can replace one Service's part.
	Parts map[portal.ServiceKey]*part
	// Losers are the Services that lost an entry to another: when anything
	// changes, they are re-added too, so that one takes a freed entry.
	Losers      map[portal.ServiceKey]bool
	VIPRefs     map[netip.Addr]int
	RuleRefs    map[string]int
	SetRefs     map[string]int
	AllowedRefs map[vsKey]int
}

// part is what one Service contributed to a plan.
type part struct {
	Servers []vsKey
	VIPs    []netip.Addr
	Rules   []string
	Sets    []string
	Local   []string
	Allowed []vsKey
}

type srChain struct {
	Family portal.Family
	Rules  [][]string
}

// rangeSet is one ipset of source ranges: the sorted, distinct networks
// (hash:net cannot hold a /0, so it holds the two halves instead).
type rangeSet struct {
	Family portal.Family
	Nets   []netip.Prefix
}

func (s rangeSet) equal(o rangeSet) bool { return s.Family == o.Family && slices.Equal(s.Nets, o.Nets) }

// planInput is what plan needs besides the snapshot.
type planInput struct {
	Cfg       dataplane.Config
	Sched     string
	NodeAddrs []netip.Addr // NodePort addresses, both families
	// Refused are the schedulers the kernel lacks: a Service asking for
	// one gets Sched instead (and an event).
	Refused map[string]bool
}

func newPlan() *plan {
	return &plan{Servers: map[vsKey]*virtualServer{}, VIPs: map[netip.Addr]bool{}, Rules: map[string]rule{},
		SRChains: map[string]srChain{}, Sets: map[string]rangeSet{}, Local: map[string][]string{}, Topology: map[string]string{},
		Parts: map[portal.ServiceKey]*part{}, Losers: map[portal.ServiceKey]bool{}, VIPRefs: map[netip.Addr]int{}, RuleRefs: map[string]int{}, SetRefs: map[string]int{},
		Allowed: map[vsKey]bool{}, AllowedRefs: map[vsKey]int{}}
}

// expandDirty adds the Services that lost a conflict to dirty, sorted as
// buildPlan adds Services, so that an incremental plan equals a full one.
func (pl *plan) expandDirty(dirty []portal.ServiceKey) []portal.ServiceKey {
	out := slices.Clone(dirty)
	for k := range pl.Losers {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b portal.ServiceKey) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// replace swaps the parts of the (expanded) dirty Services for their
// current version in services (absent: deleted).
func (pl *plan) replace(in planInput, dirty []portal.ServiceKey, services map[portal.ServiceKey]*portal.Service) {
	pl.Conflicts, pl.Panics = nil, nil
	for _, k := range dirty {
		pl.removeService(k)
	}
	for _, k := range dirty {
		if s := services[k]; s != nil {
			pl.addService(in, k, s)
		}
	}
}

// addService adds the portals of s (Service k), recording its part. A
// panic while doing so is confined to k: what k added so far is taken out
// again, the panic is recorded in pl.Panics, and the plan holds every other
// Service as if k did not exist.
func (pl *plan) addService(in planInput, k portal.ServiceKey, s *portal.Service) {
	pt := &part{}
	pl.Parts[k] = pt
	conflicts := len(pl.Conflicts)
	if p := dataplane.CatchServicePanic("ipvs", k, func() {
		for _, p := range s.Portals {
			pl.addPortal(in, p, pt)
		}
	}); p != nil {
		pl.removeService(k)
		pl.Conflicts = pl.Conflicts[:conflicts]
		pl.Panics = append(pl.Panics, *p)
	}
}

// removeService takes out what Service k contributed.
func (pl *plan) removeService(k portal.ServiceKey) {
	pt := pl.Parts[k]
	delete(pl.Losers, k)
	if pt == nil {
		return
	}
	delete(pl.Parts, k)
	for _, vk := range pt.Servers {
		if v := pl.Servers[vk]; v != nil && v.Portal.Service == k {
			delete(pl.Servers, vk)
		}
	}
	for _, a := range pt.VIPs {
		if pl.VIPRefs[a]--; pl.VIPRefs[a] <= 0 {
			delete(pl.VIPRefs, a)
			delete(pl.VIPs, a)
		}
	}
	for _, r := range pt.Rules {
		if pl.RuleRefs[r]--; pl.RuleRefs[r] <= 0 {
			delete(pl.RuleRefs, r)
			delete(pl.Rules, r)
		}
	}
	for _, c := range pt.Sets {
		if pl.SetRefs[c]--; pl.SetRefs[c] <= 0 {
			delete(pl.SetRefs, c)
			delete(pl.Sets, c)
		}
	}
	for _, l := range pt.Local {
		delete(pl.Local, l)
		delete(pl.Topology, l)
	}
	for _, k := range pt.Allowed {
		if pl.AllowedRefs[k]--; pl.AllowedRefs[k] <= 0 {
			delete(pl.AllowedRefs, k)
			delete(pl.Allowed, k)
		}
	}
}

func (pl *plan) addVIP(a netip.Addr, pt *part) {
	pl.VIPs[a] = true
	pl.VIPRefs[a]++
	pt.VIPs = append(pt.VIPs, a)
}

func (pl *plan) addAllowed(k vsKey, pt *part) {
	pl.Allowed[k] = true
	pl.AllowedRefs[k]++
	pt.Allowed = append(pt.Allowed, k)
}

func (pl *plan) addPartRule(r rule, pt *part) {
	k := r.key()
	pl.Rules[k] = r
	pl.RuleRefs[k]++
	pt.Rules = append(pt.Rules, k)
}

// subset returns the plan restricted to the given keys, for diffing only
// what an incremental sync touched. Servers are copied (their destinations
// change as they drain).
func (pl *plan) subset(t *touched) *plan {
	out := newPlan()
	for k := range t.servers {
		if v := pl.Servers[k]; v != nil {
			c := *v
			c.Dests = maps.Clone(v.Dests)
			out.Servers[k] = &c
		}
	}
	for a := range t.vips {
		if pl.VIPs[a] {
			out.VIPs[a] = true
		}
	}
	for r := range t.rules {
		if x, ok := pl.Rules[r]; ok {
			out.Rules[r] = x
		}
	}
	for c := range t.sets {
		if x, ok := pl.Sets[c]; ok {
			out.Sets[c] = x
		}
	}
	for k := range t.allowed {
		if pl.Allowed[k] {
			out.Allowed[k] = true
		}
	}
	return out
}

// touched is the set of keys an incremental sync looks at.
type touched struct {
	servers map[vsKey]bool
	vips    map[netip.Addr]bool
	rules   map[string]bool
	sets    map[string]bool
	allowed map[vsKey]bool
}

func newTouched() *touched {
	return &touched{servers: map[vsKey]bool{}, vips: map[netip.Addr]bool{}, rules: map[string]bool{}, sets: map[string]bool{}, allowed: map[vsKey]bool{}}
}

func (t *touched) addPart(pt *part) {
	if pt == nil {
		return
	}
	for _, k := range pt.Servers {
		t.servers[k] = true
	}
	for _, a := range pt.VIPs {
		t.vips[a] = true
	}
	for _, r := range pt.Rules {
		t.rules[r] = true
	}
	for _, c := range pt.Sets {
		t.sets[c] = true
	}
	for _, k := range pt.Allowed {
		t.allowed[k] = true
	}
}

// buildPlan computes the desired IPVS services, VIPs and iptables rules.
func buildPlan(in planInput, services map[portal.ServiceKey]*portal.Service) *plan {
	pl := newPlan()
	keys := make([]portal.ServiceKey, 0, len(services))
	for k := range services {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b portal.ServiceKey) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		pl.addService(in, k, services[k])
	}
	return pl
}

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

// addRangeSet adds (or refers again to) the set of p's source ranges and
// returns its name. It is named for the Service and family, so that a change
// of ranges is a diff of its elements; a portal of the same Service and
// family with other ranges (the builder never makes one) gets its own.
func (pl *plan) addRangeSet(p *portal.Portal, pt *part) string {
	rs := rangeSet{Family: p.Key.Family}
	for _, r := range p.SourceRanges {
		r = r.Masked()
		if !r.IsValid() || portal.FamilyOf(r.Addr()) != p.Key.Family || r.Addr().Is4In6() {
			continue // another family's, or not expressible in the set: left out, so not allowed
		}
		if r.Bits() == 0 { // hash:net refuses /0: the two halves
			lo, hi := splitZero(r.Addr().BitLen())
			rs.Nets = append(rs.Nets, lo, hi)
			continue
		}
		rs.Nets = append(rs.Nets, r)
	}
	slices.SortFunc(rs.Nets, comparePrefix)
	rs.Nets = slices.Compact(rs.Nets)
	name := rangeSetName(p.Key.Service.String(), p.Key.Family)
	if old, ok := pl.Sets[name]; ok && !old.equal(rs) {
		name = rangeSetName(p.Key.String(), p.Key.Family)
	}
	if !slices.Contains(pt.Sets, name) {
		pl.Sets[name] = rs
		pl.SetRefs[name]++
		pt.Sets = append(pt.Sets, name)
	}
	return name
}

func splitZero(bits int) (netip.Prefix, netip.Prefix) {
	if bits == 32 {
		return netip.MustParsePrefix("0.0.0.0/1"), netip.MustParsePrefix("128.0.0.0/1")
	}
	return netip.MustParsePrefix("::/1"), netip.MustParsePrefix("8000::/1")
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// rangeSetName is ONEHOP-RANGES- and 16 hex digits (ipset names have at
// most 31 characters).
func rangeSetName(owner string, fam portal.Family) string {
	h := sha256.Sum256([]byte(owner + " " + fam.String()))
	return rangeSetPrefix + strings.ToUpper(hex.EncodeToString(h[:])[:16])
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
