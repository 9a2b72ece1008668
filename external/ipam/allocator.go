package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/portal"
)

// Port is one port a Service exposes on its load-balancer IP.
type Port struct {
	Protocol portal.Protocol
	Port     uint16
}

func (p Port) String() string { return fmt.Sprintf("%d/%s", p.Port, p.Protocol) }

// Request is what one Service asks for.
type Request struct {
	Service portal.ServiceKey
	// Families are the wanted IP families, primary first (spec.ipFamilies).
	// Empty means IPv4, or the families of Requested.
	Families []portal.Family
	// RequireAll makes every family mandatory (RequireDualStack); otherwise
	// only the primary one is, and the others are given when a pool can.
	RequireAll bool
	// Requested are specific addresses asked for, at most one per family.
	Requested []netip.Addr
	// Pool restricts allocation to the named pool; "" means any
	// auto-assigning pool (or any pool for Requested addresses).
	Pool string
	// SharingKey allows sharing an IP with Services of the same key whose
	// ports do not collide; "" means the IP is the Service's alone.
	SharingKey string
	Ports      []Port
	// Labels are the Service's labels, matched against pools' selectors.
	Labels map[string]string
	// Local is externalTrafficPolicy: Local. Services share an address
	// only when their policies agree and, when Local, when they select the
	// same pods (Selector), so that the nodes serving the address serve
	// every Service on it.
	Local bool
	// Selector is the Service's pod selector in canonical form ("" when
	// it has none).
	Selector string
}

// Reason classifies a refusal; it is used as the Kubernetes event reason.
type Reason string

// The reasons an allocation is refused.
const (
	ReasonExhausted   Reason = "AllocationFailed"
	ReasonConflict    Reason = "IPConflict"
	ReasonNotInPool   Reason = "IPNotInPool"
	ReasonUnknownPool Reason = "UnknownPool"
	ReasonBadRequest  Reason = "BadRequest"
	// ReasonPoolNotAllowed: the pool does not serve the Service's
	// namespace or labels.
	ReasonPoolNotAllowed Reason = "PoolNotAllowed"
	// ReasonOutsidePools is no refusal: a Service keeps an address that
	// no pool holds any more (see Outside).
	ReasonOutsidePools Reason = "IPOutsidePools"
)

// Error is a refusal with a reason and a message meant for users.
type Error struct {
	Reason Reason
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

func refuse(r Reason, format string, a ...any) *Error {
	return &Error{Reason: r, Msg: fmt.Sprintf(format, a...)}
}

type use struct {
	key     string
	holders map[portal.ServiceKey]holder
}

// holder is what sharing compares between the Services on one address.
type holder struct {
	ports    []Port
	local    bool
	selector string
}

// Allocator tracks which Service holds which IP. It is not safe for
// concurrent use.
type Allocator struct {
	pools []Pool
	ips   map[netip.Addr]*use
	svcs  map[portal.ServiceKey][]netip.Addr
	// Reserved, when set, names who else holds ip (a node, a cluster IP,
	// a Service's spec.externalIPs, a Pod), or returns "" when nobody
	// does. Reserved addresses are neither handed out nor kept.
	Reserved func(ip netip.Addr) string
}

// New returns an empty allocator over pools. Pool names must be unique and
// pools must not overlap.
func New(pools []Pool) (*Allocator, error) {
	names := map[string]bool{}
	for i, p := range pools {
		if names[p.Name] {
			return nil, fmt.Errorf("pool %q defined twice", p.Name)
		}
		names[p.Name] = true
		for _, q := range pools[:i] {
			for _, r := range p.Ranges {
				for _, s := range q.Ranges {
					if r.First.BitLen() == s.First.BitLen() && r.First.Compare(s.Last) <= 0 && s.First.Compare(r.Last) <= 0 {
						return nil, fmt.Errorf("pools %q and %q overlap (%s, %s)", q.Name, p.Name, s, r)
					}
				}
			}
		}
	}
	return &Allocator{pools: pools, ips: map[netip.Addr]*use{}, svcs: map[portal.ServiceKey][]netip.Addr{}}, nil
}

// Pools returns the allocator's pools.
func (a *Allocator) Pools() []Pool { return a.pools }

// PoolOf returns the pool holding ip, or nil.
func (a *Allocator) PoolOf(ip netip.Addr) *Pool {
	for i := range a.pools {
		if a.pools[i].Contains(ip) {
			return &a.pools[i]
		}
	}
	return nil
}

func (a *Allocator) pool(name string) *Pool {
	for i := range a.pools {
		if a.pools[i].Name == name {
			return &a.pools[i]
		}
	}
	return nil
}

// Holds returns the IPs svc holds, sorted.
func (a *Allocator) Holds(svc portal.ServiceKey) []netip.Addr { return slices.Clone(a.svcs[svc]) }

// Outside returns the IPs svc holds that are in no pool, sorted: its pool
// shrank or went away while svc held them. svc keeps them for as long as it
// holds them (until it asks for other addresses or goes), and nobody else
// is given them: no pool hands them out, and a request for one is refused.
func (a *Allocator) Outside(svc portal.ServiceKey) []netip.Addr {
	var out []netip.Addr
	for _, ip := range a.svcs[svc] {
		if a.PoolOf(ip) == nil {
			out = append(out, ip)
		}
	}
	return out
}

// keepsOutside: svc holds ip, and no pool does.
func (a *Allocator) keepsOutside(svc portal.ServiceKey, ip netip.Addr) bool {
	return slices.Contains(a.svcs[svc], ip) && a.PoolOf(ip) == nil
}

// InUse returns the number of allocated IPs.
func (a *Allocator) InUse() int { return len(a.ips) }

// Release frees everything svc holds.
func (a *Allocator) Release(svc portal.ServiceKey) {
	for _, ip := range a.svcs[svc] {
		u := a.ips[ip]
		delete(u.holders, svc)
		if len(u.holders) == 0 {
			delete(a.ips, ip)
		}
	}
	delete(a.svcs, svc)
}

// Restore records that svc already holds ips (read back from Service status
// when an allocator starts), without choosing anything. It refuses addresses
// of a pool that is not the request's or does not serve it, and addresses
// held by another Service incompatibly; the caller then allocates afresh
// for that Service. An address in no pool at all (its pool shrank or was
// deleted) is kept: a pool change never renumbers a Service (see Outside).
func (a *Allocator) Restore(req Request, ips []netip.Addr) error {
	seen := map[portal.Family]bool{}
	for _, ip := range ips {
		ip = ip.Unmap()
		if seen[portal.FamilyOf(ip)] {
			return refuse(ReasonBadRequest, "more than one %s address in status", portal.FamilyOf(ip))
		}
		seen[portal.FamilyOf(ip)] = true
		if a.PoolOf(ip) != nil { // outside every pool: kept, unless someone else holds it
			if err := a.checkPool(req, ip); err != nil {
				return err
			}
		}
		if err := a.compatible(req, ip); err != nil {
			return err
		}
	}
	a.Release(req.Service)
	a.record(req, ips)
	return nil
}

// Assign gives req.Service its IPs: the ones it holds when they still fit
// the request, else requested or free ones. On error nothing changes.
func (a *Allocator) Assign(req Request) ([]netip.Addr, error) {
	fams, err := families(req)
	if err != nil {
		return nil, err
	}
	if req.Pool != "" {
		p := a.pool(req.Pool)
		if p == nil && len(a.Outside(req.Service)) == 0 {
			return nil, refuse(ReasonUnknownPool, "address pool %q does not exist", req.Pool)
		}
		if p != nil && !p.Admits(req.Service.Namespace, req.Labels) {
			return nil, refuse(ReasonPoolNotAllowed, "address pool %q does not serve this Service (namespace %s or labels not admitted)", req.Pool, req.Service.Namespace)
		}
	}
	var out []netip.Addr
	for i, f := range fams {
		ip, err := a.pick(req, f)
		if err != nil {
			if i > 0 && !req.RequireAll && !a.requestedFamily(req, f) {
				continue // PreferDualStack: the secondary family is best effort
			}
			return nil, err
		}
		out = append(out, ip)
	}
	a.Release(req.Service)
	a.record(req, out)
	return slices.Clone(a.svcs[req.Service]), nil
}

func (a *Allocator) requestedFamily(req Request, f portal.Family) bool {
	for _, r := range req.Requested {
		if portal.FamilyOf(r) == f {
			return true
		}
	}
	return false
}

func families(req Request) ([]portal.Family, error) {
	var fams []portal.Family
	seen := map[portal.Family]bool{}
	for _, r := range req.Requested {
		if !r.IsValid() {
			return nil, refuse(ReasonBadRequest, "invalid requested address")
		}
		f := portal.FamilyOf(r)
		if seen[f] {
			return nil, refuse(ReasonBadRequest, "more than one %s address requested", f)
		}
		seen[f] = true
	}
	if len(req.Requested) > 0 {
		for _, r := range req.Requested {
			fams = append(fams, portal.FamilyOf(r))
		}
		return fams, nil
	}
	for _, f := range req.Families {
		if !slices.Contains(fams, f) {
			fams = append(fams, f)
		}
	}
	if len(fams) == 0 {
		fams = []portal.Family{portal.IPv4}
	}
	return fams, nil
}

func (a *Allocator) pick(req Request, f portal.Family) (netip.Addr, error) {
	for _, r := range req.Requested {
		r = r.Unmap()
		if portal.FamilyOf(r) != f {
			continue
		}
		if err := a.checkPool(req, r); err != nil && !a.keepsOutside(req.Service, r) {
			return netip.Addr{}, err
		}
		return r, a.compatible(req, r)
	}
	// Keep what the Service holds when it still fits, or when no pool
	// holds it any more.
	for _, h := range a.svcs[req.Service] {
		if portal.FamilyOf(h) == f && (a.checkPool(req, h) == nil || a.PoolOf(h) == nil) && a.compatible(req, h) == nil {
			return h, nil
		}
	}
	pools := a.candidatePools(req, f)
	if len(pools) == 0 {
		if req.Pool != "" {
			return netip.Addr{}, refuse(ReasonExhausted, "address pool %q has no %s addresses", req.Pool, f)
		}
		return netip.Addr{}, refuse(ReasonExhausted, "no auto-assigning address pool serving this Service has %s addresses", f)
	}
	// Prefer an IP already shared under the same key.
	if req.SharingKey != "" {
		var shared []netip.Addr
		for ip, u := range a.ips {
			if u.key == req.SharingKey && portal.FamilyOf(ip) == f && inAny(pools, ip) && a.compatible(req, ip) == nil {
				shared = append(shared, ip)
			}
		}
		if len(shared) > 0 {
			slices.SortFunc(shared, netip.Addr.Compare)
			return shared[0], nil
		}
	}
	for _, p := range pools {
		for _, r := range p.Ranges {
			if portal.FamilyOf(r.First) != f {
				continue
			}
			for ip := r.First; ip.IsValid() && ip.Compare(r.Last) <= 0; ip = ip.Next() {
				if _, used := a.ips[ip]; !used && a.reserved(ip) == "" {
					return ip, nil
				}
			}
		}
	}
	names := make([]string, len(pools))
	for i, p := range pools {
		names[i] = p.Name
	}
	return netip.Addr{}, refuse(ReasonExhausted, "no free %s address in pool(s) %s", f, strings.Join(names, ", "))
}

func inAny(pools []*Pool, ip netip.Addr) bool {
	for _, p := range pools {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// candidatePools are the named pool, or else the auto-assigning pools not
// meant for Pods that admit the Service, by priority.
func (a *Allocator) candidatePools(req Request, f portal.Family) []*Pool {
	var out []*Pool
	for i := range a.pools {
		p := &a.pools[i]
		if !p.HasFamily(f) || !p.Admits(req.Service.Namespace, req.Labels) {
			continue
		}
		if req.Pool != "" && p.Name != req.Pool || req.Pool == "" && (!p.AutoAssign || p.AllowPods) {
			continue
		}
		out = append(out, p)
	}
	slices.SortStableFunc(out, func(x, y *Pool) int { return cmp.Compare(x.Priority, y.Priority) })
	return out
}

func (a *Allocator) reserved(ip netip.Addr) string {
	if a.Reserved == nil {
		return ""
	}
	return a.Reserved(ip)
}

// checkPool: ip must be in the named pool, or in some pool, and that pool
// must admit the Service.
func (a *Allocator) checkPool(req Request, ip netip.Addr) error {
	var p *Pool
	if req.Pool != "" {
		p = a.pool(req.Pool)
		if p == nil {
			return refuse(ReasonUnknownPool, "address pool %q does not exist", req.Pool)
		}
		if !p.Contains(ip) {
			return refuse(ReasonNotInPool, "%s is not in address pool %q", ip, req.Pool)
		}
	} else if p = a.PoolOf(ip); p == nil {
		return refuse(ReasonNotInPool, "%s is in no address pool", ip)
	}
	if !p.Admits(req.Service.Namespace, req.Labels) {
		return refuse(ReasonPoolNotAllowed, "%s is in address pool %q, which does not serve this Service (namespace %s or labels not admitted)", ip, p.Name, req.Service.Namespace)
	}
	return nil
}

// compatible: ip is reserved by nobody else, and free, held only by
// req.Service, or shareable with all its other holders: the same sharing
// key, in the same namespace unless the pool shares across namespaces, the
// same traffic policy and, when Local, the same pod selector; no port in
// common.
func (a *Allocator) compatible(req Request, ip netip.Addr) error {
	if who := a.reserved(ip); who != "" {
		return refuse(ReasonConflict, "%s is held by %s", ip, who)
	}
	u := a.ips[ip]
	if u == nil {
		return nil
	}
	var others []portal.ServiceKey
	for svc := range u.holders {
		if svc != req.Service {
			others = append(others, svc)
		}
	}
	if len(others) == 0 {
		return nil
	}
	slices.SortFunc(others, func(x, y portal.ServiceKey) int { return strings.Compare(x.String(), y.String()) })
	if req.SharingKey == "" || u.key != req.SharingKey {
		return refuse(ReasonConflict, "%s is already used by %s and not shared with this Service (sharing keys differ or are unset)", ip, describe(req, others))
	}
	p := a.PoolOf(ip)
	for _, svc := range others {
		h := u.holders[svc]
		if svc.Namespace != req.Service.Namespace && (p == nil || !p.ShareAcrossNamespaces) {
			return refuse(ReasonConflict, "%s is shared under key %q by a Service of another namespace; pool %q shares only within one namespace", ip, req.SharingKey, poolName(p))
		}
		if h.local != req.Local {
			return refuse(ReasonConflict, "%s is shared with %s, whose externalTrafficPolicy differs", ip, describe(req, []portal.ServiceKey{svc}))
		}
		if req.Local && (req.Selector == "" || h.selector != req.Selector) {
			return refuse(ReasonConflict, "%s is shared with %s; Services with externalTrafficPolicy Local share an address only when they select the same pods", ip, describe(req, []portal.ServiceKey{svc}))
		}
		for _, p := range req.Ports {
			if slices.Contains(h.ports, p) {
				return refuse(ReasonConflict, "%s is shared with %s, which already uses port %s", ip, describe(req, []portal.ServiceKey{svc}), p)
			}
		}
	}
	return nil
}

// describe names Services for an event on req.Service's: those of other
// namespaces only by that fact, so that no tenant learns another's names.
func describe(req Request, svcs []portal.ServiceKey) string {
	var names []string
	foreign := false
	for _, s := range svcs {
		if s.Namespace == req.Service.Namespace {
			names = append(names, "Service "+s.String())
		} else {
			foreign = true
		}
	}
	if foreign {
		names = append(names, "a Service of another namespace")
	}
	return strings.Join(names, ", ")
}

func poolName(p *Pool) string {
	if p == nil {
		return ""
	}
	return p.Name
}

func (a *Allocator) record(req Request, ips []netip.Addr) {
	var held []netip.Addr
	for _, ip := range ips {
		ip = ip.Unmap()
		u := a.ips[ip]
		if u == nil {
			u = &use{key: req.SharingKey, holders: map[portal.ServiceKey]holder{}}
			a.ips[ip] = u
		}
		u.holders[req.Service] = holder{ports: slices.Clone(req.Ports), local: req.Local, selector: req.Selector}
		held = append(held, ip)
	}
	slices.SortFunc(held, netip.Addr.Compare)
	if len(held) > 0 {
		a.svcs[req.Service] = held
	}
}
