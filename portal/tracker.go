package portal

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Reporter receives the Problems found while building a Service: each
// problem once while it lasts, however often the Service or its slices
// change (a problem that goes away and comes back is new again).
type Reporter interface {
	Report(svc *v1.Service, problems []Problem)
}

// Tracker keeps the Kubernetes objects the model needs and builds
// Snapshots from them, rebuilding only the Services that changed. Its On*
// methods are informer handlers; Snapshot is called by the sync runner.
type Tracker struct {
	mu       sync.Mutex
	cfg      Config
	reporter Reporter
	notify   func()

	services map[ServiceKey]*v1.Service
	slices   map[ServiceKey]map[string]*discovery.EndpointSlice
	node     *v1.Node

	built     map[ServiceKey]*Service
	claims    *claims
	dirty     map[ServiceKey]struct{}
	nodeAddrs []netip.Addr
	podIPs    []PodExternalIP
	// changed is when the oldest unsynced change arrived (zero: none).
	changed time.Time
	// triggers are the last-change-trigger-time annotations of pending slice changes.
	triggers []time.Time
	// reported are the problems each Service has now and the Reporter was
	// told of, by reason and message.
	reported map[ServiceKey]map[problemKey]bool
	// refusedExt are the external IPs held by someone else, per Service
	// (SetRefusedExternalIPs).
	refusedExt map[ServiceKey][]netip.Addr
	// cidrObjects are the spec.cidrs of each ServiceCIDR object, by name;
	// serviceCIDRs their union with cfg.ServiceCIDRs (UnionCIDRs).
	cidrObjects  map[string][]netip.Prefix
	serviceCIDRs []netip.Prefix
}

// problemKey identifies a problem for reporting it once.
type problemKey struct{ reason, message string }

// NewTracker returns an empty Tracker. notify is called (without the lock
// held) after every change; reporter may be nil.
func NewTracker(cfg Config, reporter Reporter, notify func()) *Tracker {
	if notify == nil {
		notify = func() {}
	}
	return &Tracker{
		cfg: cfg, reporter: reporter, notify: notify,
		services: map[ServiceKey]*v1.Service{},
		slices:   map[ServiceKey]map[string]*discovery.EndpointSlice{},
		built:    map[ServiceKey]*Service{},
		claims:   newClaims(),
		dirty:    map[ServiceKey]struct{}{},
		reported: map[ServiceKey]map[problemKey]bool{},

		cidrObjects:  map[string][]netip.Prefix{},
		serviceCIDRs: UnionCIDRs(cfg.ServiceCIDRs),
	}
}

// newProblems returns the problems of k's latest build that were not
// reported already, and remembers the build's problems. Called with t.mu
// held.
func (t *Tracker) newProblems(k ServiceKey, problems []Problem) []Problem {
	old := t.reported[k]
	if len(problems) == 0 {
		delete(t.reported, k)
		return nil
	}
	now := make(map[problemKey]bool, len(problems))
	var fresh []Problem
	for _, p := range problems {
		pk := problemKey{p.Reason, p.Message}
		now[pk] = true
		if !old[pk] {
			fresh = append(fresh, p)
		}
	}
	t.reported[k] = now
	return fresh
}

func (t *Tracker) markLocked(k ServiceKey) {
	t.dirty[k] = struct{}{}
	if t.changed.IsZero() {
		t.changed = time.Now()
	}
}

// SetService records a new or updated Service.
func (t *Tracker) SetService(svc *v1.Service) {
	k := ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	t.services[k] = svc
	t.markLocked(k)
	t.mu.Unlock()
	t.notify()
}

// DeleteService records a deleted Service.
func (t *Tracker) DeleteService(namespace, name string) {
	k := ServiceKey{Namespace: namespace, Name: name}
	t.mu.Lock()
	delete(t.services, k)
	t.markLocked(k)
	t.mu.Unlock()
	t.notify()
}

func sliceService(es *discovery.EndpointSlice) (ServiceKey, bool) {
	name := es.Labels[LabelServiceName]
	return ServiceKey{Namespace: es.Namespace, Name: name}, name != ""
}

// SetSlice records a new or updated EndpointSlice.
func (t *Tracker) SetSlice(es *discovery.EndpointSlice) {
	k, ok := sliceService(es)
	if !ok {
		return
	}
	t.mu.Lock()
	m := t.slices[k]
	if m == nil {
		m = map[string]*discovery.EndpointSlice{}
		t.slices[k] = m
	}
	m[es.Name] = es
	if ts, err := time.Parse(time.RFC3339Nano, es.Annotations[v1.EndpointsLastChangeTriggerTime]); err == nil {
		t.triggers = append(t.triggers, ts)
	}
	t.markLocked(k)
	t.mu.Unlock()
	t.notify()
}

// DeleteSlice records a deleted EndpointSlice.
func (t *Tracker) DeleteSlice(es *discovery.EndpointSlice) {
	k, ok := sliceService(es)
	if !ok {
		return
	}
	t.mu.Lock()
	if m := t.slices[k]; m != nil {
		delete(m, es.Name)
		if len(m) == 0 {
			delete(t.slices, k)
		}
	}
	t.markLocked(k)
	t.mu.Unlock()
	t.notify()
}

// SetNode records this node's object. A change of zone rebuilds every
// Service, a change of primary addresses the Services with
// loadBalancerSourceRanges; other changes of addresses only the node-level
// state.
func (t *Tracker) SetNode(n *v1.Node) {
	t.mu.Lock()
	zone := n.Labels[v1.LabelTopologyZone]
	if zone != t.cfg.NodeZone {
		t.cfg.NodeZone = zone
		for k := range t.services {
			t.markLocked(k)
		}
	}
	if primary := nodePortAddrs(n, nil); !slices.Equal(primary, t.cfg.NodeIPs) {
		t.cfg.NodeIPs = primary
		for k, svc := range t.services {
			if len(svc.Spec.LoadBalancerSourceRanges) > 0 {
				t.markLocked(k)
			}
		}
	}
	t.node = n
	addrs := nodePortAddrs(n, t.cfg.NodePortCIDRs)
	changed := !slices.Equal(addrs, t.nodeAddrs)
	t.nodeAddrs = addrs
	if changed && t.changed.IsZero() {
		t.changed = time.Now()
	}
	t.mu.Unlock()
	t.notify()
}

// SetPodExternalIPs records the external IPs of pods on this node (as the
// external package computes them from Pods). Entries of another family pair
// or with invalid addresses are ignored.
func (t *Tracker) SetPodExternalIPs(ips []PodExternalIP) {
	var clean []PodExternalIP
	for _, p := range ips {
		if p.External.IsValid() && p.Pod.IsValid() && FamilyOf(p.External) == FamilyOf(p.Pod) {
			clean = append(clean, p)
		}
	}
	slices.SortFunc(clean, func(a, b PodExternalIP) int { return a.External.Compare(b.External) })
	t.mu.Lock()
	if slices.Equal(clean, t.podIPs) {
		t.mu.Unlock()
		return
	}
	t.podIPs = clean
	if t.changed.IsZero() {
		t.changed = time.Now()
	}
	t.mu.Unlock()
	t.notify()
}

// Service returns the Service object k, nil when unknown.
func (t *Tracker) Service(k ServiceKey) *v1.Service {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.services[k]
}

// Node returns this node's object, nil until seen.
func (t *Tracker) Node() *v1.Node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node
}

// Pending reports whether changes wait for a sync, and since when.
func (t *Tracker) Pending() (bool, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.changed.IsZero(), t.changed
}

// Snapshot rebuilds the changed Services and returns the desired state.
// The returned Services map is the Tracker's own: it must only be read, and
// only until the next call to Snapshot. The trigger times of the slice
// changes it contains are returned for programming-latency metrics.
func (t *Tracker) Snapshot() (*Snapshot, []time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	snap := &Snapshot{
		Node:     Node{Name: t.cfg.NodeName, NodePortAddrs: t.nodeAddrs, PodExternalIPs: t.podIPs},
		Services: t.built,
		// Replaced, never changed, when the ranges change: the
		// dataplane may keep it.
		ServiceCIDRs: t.serviceCIDRs,
	}
	type report struct {
		svc      *v1.Service
		problems []Problem
	}
	var reports []report
	// Oldest first, so that the first claimant of an address keeps it
	// deterministically within one snapshot.
	work := make([]ServiceKey, 0, len(t.dirty))
	for k := range t.dirty {
		work = append(work, k)
	}
	t.sortByAge(work)
	done := map[ServiceKey]bool{}
	rounds := map[ServiceKey]int{}
	inDirty := map[ServiceKey]bool{}
	const maxRounds = 3
	for len(work) > 0 {
		k := work[0]
		work = work[1:]
		if done[k] {
			continue
		}
		done[k] = true
		// Services that lost a claim to k get their chance again, also
		// one built earlier in this snapshot (an older Service taking an
		// address that a newer one lets go in the same window); rounds
		// bounds how often, so that no chain of claims can cycle.
		for _, again := range t.claims.release(k) {
			if rounds[again] < maxRounds {
				rounds[again]++
				done[again] = false
				work = append(work, again)
			}
		}
		svc := t.services[k]
		var built *Service
		if svc != nil {
			var problems []Problem
			var again []ServiceKey
			built, problems, again = t.build(k, svc)
			work = append(work, again...)
			if fresh := t.newProblems(k, dedupe(problems)); len(fresh) > 0 {
				reports = append(reports, report{svc, fresh})
			}
		} else {
			delete(t.reported, k)
		}
		old := t.built[k]
		if built == nil {
			if old == nil {
				continue
			}
			delete(t.built, k)
		} else if old.Same(built) {
			continue
		} else {
			t.built[k] = built
		}
		if !inDirty[k] { // a Service built twice is listed once
			inDirty[k] = true
			snap.Dirty = append(snap.Dirty, k)
		}
	}
	clear(t.dirty)
	t.changed = time.Time{}
	triggers := t.triggers
	t.triggers = nil
	if t.reporter != nil {
		for _, r := range reports {
			t.reporter.Report(r.svc, r.problems)
		}
	}
	return snap, triggers
}

// sortByAge orders Services by creation time, then name.
func (t *Tracker) sortByAge(keys []ServiceKey) {
	slices.SortFunc(keys, func(a, b ServiceKey) int {
		sa, sb := t.services[a], t.services[b]
		if sa != nil && sb != nil {
			if c := sa.CreationTimestamp.Compare(sb.CreationTimestamp.Time); c != 0 {
				return c
			}
		}
		if a.Namespace != b.Namespace {
			return strings.Compare(a.Namespace, b.Namespace)
		}
		return strings.Compare(a.Name, b.Name)
	})
}

func sliceList(m map[string]*discovery.EndpointSlice) []*discovery.EndpointSlice {
	out := make([]*discovery.EndpointSlice, 0, len(m))
	for _, es := range m {
		out = append(out, es)
	}
	slices.SortFunc(out, func(a, b *discovery.EndpointSlice) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

func dedupe(ps []Problem) []Problem {
	var out []Problem
	for _, p := range ps {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// nodePortAddrs picks the addresses NodePorts are served on: the node's
// addresses inside cidrs or, with no cidrs, its primary (first internal, else
// first external) address of each family. Loopback is never included.
func nodePortAddrs(n *v1.Node, cidrs []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	primary := map[Family]bool{}
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, na := range n.Status.Addresses {
			if na.Type != typ {
				continue
			}
			a, ok := parseAddr(na.Address)
			if !ok || a.IsLoopback() {
				continue
			}
			if len(cidrs) > 0 {
				if inAny(cidrs, a) && !slices.Contains(out, a) {
					out = append(out, a)
				}
				continue
			}
			if !primary[FamilyOf(a)] {
				primary[FamilyOf(a)] = true
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
