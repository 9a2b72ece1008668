package ipvs

import (
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
	release(pl.VIPs, pl.VIPRefs, pt.VIPs)
	release(pl.Rules, pl.RuleRefs, pt.Rules)
	release(pl.Sets, pl.SetRefs, pt.Sets)
	for _, l := range pt.Local {
		delete(pl.Local, l)
		delete(pl.Topology, l)
	}
	release(pl.Allowed, pl.AllowedRefs, pt.Allowed)
}

// release drops a part's reference to each of keys, and takes out of m
// the ones no part refers to any more.
func release[K comparable, V any](m map[K]V, refs map[K]int, keys []K) {
	for _, k := range keys {
		if refs[k]--; refs[k] <= 0 {
			delete(refs, k)
			delete(m, k)
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
	copyKeys(out.VIPs, pl.VIPs, t.vips)
	copyKeys(out.Rules, pl.Rules, t.rules)
	copyKeys(out.Sets, pl.Sets, t.sets)
	copyKeys(out.Allowed, pl.Allowed, t.allowed)
	return out
}

// copyKeys copies the entries of from whose keys are in keys into to.
func copyKeys[K comparable, V any](to, from map[K]V, keys map[K]bool) {
	for k := range keys {
		if v, ok := from[k]; ok {
			to[k] = v
		}
	}
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
	addKeys(t.servers, pt.Servers)
	addKeys(t.vips, pt.VIPs)
	addKeys(t.rules, pt.Rules)
	addKeys(t.sets, pt.Sets)
	addKeys(t.allowed, pt.Allowed)
}

// addKeys puts each of keys in set.
func addKeys[K comparable](set map[K]bool, keys []K) {
	for _, k := range keys {
		set[k] = true
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
