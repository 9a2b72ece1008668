package dataplane

import (
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// ConntrackCleaner deletes the conntrack entries that a Service change
// leaves pointing the wrong way. A conntrack entry pins its NAT decision for
// as long as it lives, and every packet of the same 5-tuple follows it:
//
//   - UDP and SCTP flows have no handshake to fail: while an entry lives
//     (refreshed by every datagram) new datagrams follow it, as in
//     kube-proxy;
//   - a TCP SYN that got no answer (to an endpoint that died before the node
//     heard of it, or through an address the node did not serve yet) leaves
//     an entry in SYN_SENT for two minutes, refreshed by every retransmit. A
//     client that reuses the source port within that time joins the dead
//     entry instead of being balanced afresh, and its new connection fails
//     although the Service is healthy. Only such half-open entries are
//     deleted: an established connection to a terminating endpoint is left
//     to finish.
//
// A flow DNATed to an endpoint that still serves the Service port (ready,
// or serving and terminating: portal.Portal.Serving) is left alone,
// whatever topology, traffic policies or the choice between ready and
// terminating endpoints now do with new flows: as kube-proxy does, so that
// a UDP flow fares as a TCP connection would, which a change of the
// Service never cuts. So, for the Service ports whose change can leave
// stale entries:
//
//   - when an endpoint stops serving or goes away, entries DNATed to it
//     are deleted;
//   - when a Service port goes from no endpoints to some (or is created, or
//     re-created), entries made while it had none were not DNATed (routed
//     elsewhere, or recorded while rejected): entries to those addresses
//     and the NodePort that were not DNATed are deleted, so the next
//     packet is load-balanced;
//   - when an address or NodePort is removed from a Service, entries DNATed
//     through it are deleted.
//
// Two cases go further than kube-proxy, which leaves them: a UDP flow must
// not outlive its Service. When a Service is deleted, the entries DNATed
// through its addresses and NodePorts are deleted; when a Service port is
// left with no serving endpoint, its NodePort's entries are deleted as well
// as its addresses' (kube-proxy cleans the addresses only).
//
// The first call after a start treats every Service as new, so entries
// left from before a restart are checked against the current endpoints.
//
// OnApplied is meant to run after every applied sync (Runner.OnApplied). It
// looks only at the snapshot's Dirty Services and remembers the Services it
// saw (the immutable *portal.Service values, not the snapshot's map) to
// compare with later ones, so a sync costs in proportion to what changed:
// the changed Service ports' serving endpoints, not the number of Services.
// The serving endpoints come with the Portals and share ClusterEndpoints'
// array when they are the same (every endpoint ready, no topology), so in
// the common case they cost no allocation of their own. A change of the
// serving endpoints alone (a terminating endpoint gone while others are
// ready) is a change of the Service too, so that its flows are cleaned, and
// costs what an endpoint change costs. Cleaning costs one walk of the
// conntrack table per IP family involved, which grows with the node's
// connections: OnApplied walks it at most once per MinInterval. A change
// that arrives sooner is cleaned, together with the ones that follow it,
// when the interval is over, so a burst of changes costs one walk, and a
// change in a quiet time is cleaned at once. Every version of a Service the
// kernel had in between counts, not only the first and the last: a flow may
// have begun through any of them (a Service that got an endpoint and lost it
// again within the interval leaves flows DNATed to that endpoint).
//
// SCTP entries are matched by address only: the netlink library does not
// decode SCTP ports, so an SCTP flow counts as stale when its destination
// is a Service IP with SCTP ports and its DNAT target is none of their
// serving endpoints' addresses; SCTP NodePorts are not cleaned.
type ConntrackCleaner struct {
	log     *slog.Logger
	netnsFD int
	// MinInterval is the least time between two walks of the conntrack
	// table started by OnApplied (default 1s); set it before the first call.
	MinInterval time.Duration

	mu     sync.Mutex
	handle *netlink.Handle
	closed bool
	// prev holds the Services as last cleaned successfully; seeded is set
	// once a whole snapshot has been taken in.
	prev   map[portal.ServiceKey]*portal.Service
	seeded bool
	// pending holds, for each Service changed since, every version
	// applied since (nil: deleted), oldest first; sctp the applied
	// Services that have SCTP ports, and nodeAddrs the addresses NodePorts
	// are served on, as last applied.
	pending   map[portal.ServiceKey][]*portal.Service
	sctp      map[portal.ServiceKey]*portal.Service
	nodeAddrs []netip.Addr
	lastWalk  time.Time
	walks     int // walks started, for tests
	timer     *time.Timer
}

// NewConntrackCleaner returns a cleaner for the network namespace behind
// netnsFD (-1: the current one). The netlink socket is opened on first use.
func NewConntrackCleaner(log *slog.Logger, netnsFD int) *ConntrackCleaner {
	if log == nil {
		log = slog.Default()
	}
	return &ConntrackCleaner{log: log, netnsFD: netnsFD, MinInterval: time.Second,
		pending: map[portal.ServiceKey][]*portal.Service{}, sctp: map[portal.ServiceKey]*portal.Service{}}
}

// OnApplied takes in the changes of an applied snapshot (snap.Dirty; the
// whole snapshot the first time, so that entries left from before a
// restart are checked against the current endpoints) and cleans them now,
// or once MinInterval has passed since the last walk. Errors are logged,
// and the same changes are cleaned again at the next call.
func (c *ConntrackCleaner) OnApplied(snap *portal.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if !c.seeded {
		c.takeAll(snap)
	} else {
		for _, k := range snap.Dirty {
			c.take(k, snap.Services[k])
		}
	}
	c.nodeAddrs = slices.Clone(snap.Node.NodePortAddrs)
	if len(c.pending) == 0 || c.timer != nil {
		return // nothing to do, or a walk is already planned
	}
	if wait := c.MinInterval - time.Since(c.lastWalk); wait > 0 {
		c.timer = time.AfterFunc(wait, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.timer = nil
			if !c.closed {
				c.cleanLogged()
			}
		})
		return
	}
	c.cleanLogged()
}

func (c *ConntrackCleaner) cleanLogged() {
	if _, err := c.clean(); err != nil {
		c.log.Error("conntrack cleanup failed; retrying at the next sync", "err", err)
	}
}

// Apply compares the whole of snap with the Services last cleaned,
// deletes the entries that the change makes stale, at once, and returns
// how many it deleted. On error the changes stay pending, so the next call
// cleans them again. It does not keep snap.Services.
func (c *ConntrackCleaner) Apply(snap *portal.Snapshot) (uint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.takeAll(snap)
	c.nodeAddrs = slices.Clone(snap.Node.NodePortAddrs)
	return c.clean()
}

// takeAll records every difference between snap and the Services last
// cleaned: what snap holds, and what it no longer holds.
func (c *ConntrackCleaner) takeAll(snap *portal.Snapshot) {
	for k, svc := range snap.Services {
		if _, ok := c.pending[k]; ok || c.prev[k] != svc {
			c.take(k, svc)
		}
	}
	for k := range c.prev {
		if _, ok := snap.Services[k]; !ok {
			c.take(k, nil)
		}
	}
	for k := range c.pending {
		if _, ok := snap.Services[k]; !ok {
			c.take(k, nil)
		}
	}
	c.seeded = true
}

// take records svc (nil: deleted) as the latest version of k.
func (c *ConntrackCleaner) take(k portal.ServiceKey, svc *portal.Service) {
	if vs := c.pending[k]; len(vs) == 0 || vs[len(vs)-1] != svc {
		c.pending[k] = append(vs, svc)
	}
	if hasSCTP(svc) {
		c.sctp[k] = svc
	} else {
		delete(c.sctp, k)
	}
}

func hasSCTP(svc *portal.Service) bool {
	if svc == nil {
		return false
	}
	for _, p := range svc.Portals {
		if p.Key.Protocol == portal.SCTP {
			return true
		}
	}
	return false
}

// clean deletes the stale entries of the pending changes; c.mu is held.
func (c *ConntrackCleaner) clean() (uint, error) {
	began := time.Now()
	f, changes := planChanges(c.prev, c.pending, c.nodeAddrs, maps.Values(c.sctp))
	if f.empty() {
		c.remember(changes)
		return 0, nil
	}
	h, err := c.netlink()
	if err != nil {
		return 0, err
	}
	c.lastWalk = began
	c.walks++
	var total uint
	var errs []error
	for _, fam := range f.families() {
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack delete (family %d): %w", fam, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return total, err
	}
	c.remember(changes)
	c.log.Info("conntrack cleaned", "deleted", total, "service_ports", f.ports, "took", time.Since(began).Round(time.Microsecond))
	return total, nil
}

// remember makes the pending changes the cleaned state.
func (c *ConntrackCleaner) remember(changes []ctChange) {
	if c.prev == nil {
		c.prev = map[portal.ServiceKey]*portal.Service{}
	}
	for _, ch := range changes {
		if ch.svc == nil {
			delete(c.prev, ch.key)
		} else {
			c.prev[ch.key] = ch.svc
		}
	}
	clear(c.pending)
}

func (c *ConntrackCleaner) netlink() (*netlink.Handle, error) {
	if c.handle != nil {
		return c.handle, nil
	}
	var (
		h   *netlink.Handle
		err error
	)
	if c.netnsFD < 0 {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	} else {
		h, err = netlink.NewHandleAt(netns.NsHandle(c.netnsFD), unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return nil, fmt.Errorf("conntrack netlink socket: %w", err)
	}
	c.handle = h
	return h, nil
}

// Close releases the netlink socket.
func (c *ConntrackCleaner) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.handle != nil {
		c.handle.Close()
		c.handle = nil
	}
}

// ctVIP is a Service address and port: an original destination.
type ctVIP struct {
	proto uint8
	addr  netip.Addr
	port  uint16 // 0 for SCTP (ports are not decoded)
}

// ctNodePort is a NodePort in one family.
type ctNodePort struct {
	proto  uint8
	family portal.Family
	port   uint16
}

// ctTarget says which flows to a destination are still right.
type ctTarget struct {
	// endpoints are the current serving endpoints; a DNATed flow to
	// another is stale. For SCTP only the addresses count (port 0).
	endpoints map[netip.AddrPort]struct{}
	// balanced: the destination has DNAT targets, so a flow that was not
	// DNATed is stale.
	balanced bool
}

// conntrackFilter matches the stale entries of the changed Service ports.
// It implements netlink.CustomConntrackFilter.
type conntrackFilter struct {
	vips      map[ctVIP]*ctTarget
	nodePorts map[ctNodePort]*ctTarget
	// nodeAddrs are the addresses NodePorts are served on; empty means any.
	nodeAddrs map[netip.Addr]struct{}
	ports     int // changed service ports, for the log
	v4, v6    bool
}

func (f *conntrackFilter) empty() bool { return len(f.vips) == 0 && len(f.nodePorts) == 0 }

func (f *conntrackFilter) families() []netlink.InetFamily {
	var out []netlink.InetFamily
	if f.v4 {
		out = append(out, unix.AF_INET)
	}
	if f.v6 {
		out = append(out, unix.AF_INET6)
	}
	return out
}

func toAddr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// MatchConntrackFlow reports whether flow is stale.
func (f *conntrackFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	proto := flow.Forward.Protocol
	switch proto {
	case uint8(portal.UDP), uint8(portal.SCTP):
	case uint8(portal.TCP):
		if !halfOpen(flow) {
			return false
		}
	default:
		return false
	}
	dst := toAddr(flow.Forward.DstIP)
	dport := flow.Forward.DstPort
	replySrc := netip.AddrPortFrom(toAddr(flow.Reverse.SrcIP), flow.Reverse.SrcPort)
	if proto == uint8(portal.SCTP) {
		dport, replySrc = 0, netip.AddrPortFrom(replySrc.Addr(), 0)
	}
	natted := replySrc != netip.AddrPortFrom(dst, dport)
	if t, ok := f.vips[ctVIP{proto, dst, dport}]; ok {
		return t.stale(natted, replySrc)
	}
	if proto == uint8(portal.SCTP) {
		return false
	}
	if t, ok := f.nodePorts[ctNodePort{proto, portal.FamilyOf(dst), dport}]; ok {
		if len(f.nodeAddrs) > 0 {
			if _, local := f.nodeAddrs[dst]; !local {
				return false
			}
		}
		return t.stale(natted, replySrc)
	}
	return false
}

// TCP conntrack states of a connection whose SYN got no SYN-ACK
// (TCP_CONNTRACK_SYN_SENT, and SYN_SENT2 of a simultaneous open).
const (
	tcpSynSent  = 1
	tcpSynSent2 = 9
)

// halfOpen reports whether a TCP flow never got an answer.
func halfOpen(flow *netlink.ConntrackFlow) bool {
	tcp, ok := flow.ProtoInfo.(*netlink.ProtoInfoTCP)
	return ok && (tcp.State == tcpSynSent || tcp.State == tcpSynSent2)
}

func (t *ctTarget) stale(natted bool, replySrc netip.AddrPort) bool {
	if !natted {
		return t.balanced
	}
	_, ok := t.endpoints[replySrc]
	return !ok
}

// ctChange is one Service to remember (svc) or forget (svc nil) once the
// cleanup succeeded.
type ctChange struct {
	key portal.ServiceKey
	svc *portal.Service
}

// planConntrack compares the remembered Services with the whole of snap
// and returns the filter of stale entries and the changes to the
// remembered Services.
func planConntrack(prev map[portal.ServiceKey]*portal.Service, snap *portal.Snapshot) (*conntrackFilter, []ctChange) {
	pending := map[portal.ServiceKey][]*portal.Service{}
	one := make([]*portal.Service, 0, len(snap.Services)+len(prev)) // one version each
	add := func(k portal.ServiceKey, svc *portal.Service) {
		one = append(one, svc)
		pending[k] = one[len(one)-1 : len(one) : len(one)]
	}
	for k, svc := range snap.Services {
		add(k, svc)
	}
	for k := range prev {
		if _, ok := snap.Services[k]; !ok {
			add(k, nil)
		}
	}
	sctp := func(yield func(*portal.Service) bool) {
		for _, svc := range snap.Services {
			if hasSCTP(svc) && !yield(svc) {
				return
			}
		}
	}
	return planChanges(prev, pending, snap.Node.NodePortAddrs, sctp)
}

// planChanges returns the filter of the entries that the pending changes
// (Service -> the versions applied since prev, oldest first, nil when
// deleted; the last is the current one) make stale, and the changes to the
// remembered Services. Services are compared by pointer: the producer
// builds a new *Service when one changes. sctp yields the latest Services
// that have SCTP ports.
func planChanges(prev map[portal.ServiceKey]*portal.Service, pending map[portal.ServiceKey][]*portal.Service, nodeAddrs []netip.Addr, sctp iter.Seq[*portal.Service]) (*conntrackFilter, []ctChange) {
	f := &conntrackFilter{vips: map[ctVIP]*ctTarget{}, nodePorts: map[ctNodePort]*ctTarget{}}
	for _, a := range nodeAddrs {
		if f.nodeAddrs == nil {
			f.nodeAddrs = map[netip.Addr]struct{}{}
		}
		f.nodeAddrs[a.Unmap()] = struct{}{}
	}
	var changes []ctChange
	for k, versions := range pending {
		if len(versions) == 0 {
			continue
		}
		cur := versions[len(versions)-1]
		// Flows may have begun through the remembered version and
		// through every one applied since, up to the current one.
		var olds []*portal.Service
		for _, v := range append([]*portal.Service{prev[k]}, versions[:len(versions)-1]...) {
			if v != cur {
				olds = append(olds, v)
			}
		}
		if len(olds) == 0 {
			continue
		}
		f.addChange(olds, cur)
		changes = append(changes, ctChange{k, cur})
	}
	f.scopeSCTP(sctp)
	return f, changes
}

// portalsByKey indexes svc's portals.
func portalsByKey(svc *portal.Service) map[portal.PortKey]*portal.Portal {
	out := map[portal.PortKey]*portal.Portal{}
	if svc == nil {
		return out
	}
	for _, p := range svc.Portals {
		out[p.Key] = p
	}
	return out
}

// balanced reports whether p DNATs to any endpoint (cluster or local): if
// not, its flows were recorded un-NATed.
func balanced(p *portal.Portal) bool {
	return p != nil && len(p.ClusterEndpoints)+len(p.LocalEndpoints) > 0
}

// servingSet is every endpoint a flow DNATed through p may stay on: the
// serving ones, and the DNAT targets, which are among them (a Portal not
// built from Kubernetes objects may leave Serving out). For SCTP only the
// addresses count (port 0).
func servingSet(p *portal.Portal) map[netip.AddrPort]struct{} {
	out := map[netip.AddrPort]struct{}{}
	if p == nil {
		return out
	}
	sctp := p.Key.Protocol == portal.SCTP
	for _, list := range [][]netip.AddrPort{p.Serving, p.ClusterEndpoints, p.LocalEndpoints} {
		for _, ep := range list {
			if sctp {
				ep = netip.AddrPortFrom(ep.Addr(), 0)
			}
			out[netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())] = struct{}{}
		}
	}
	return out
}

// vipsOf lists p's addresses (cluster, external, load-balancer) as
// original destinations.
func vipsOf(p *portal.Portal) []ctVIP {
	if p == nil {
		return nil
	}
	port := p.Port
	if p.Key.Protocol == portal.SCTP {
		port = 0
	}
	var out []ctVIP
	for _, list := range [][]netip.Addr{p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs} {
		for _, a := range list {
			out = append(out, ctVIP{uint8(p.Key.Protocol), a.Unmap(), port})
		}
	}
	return out
}

// addChange adds the destinations of the Service ports that changed from
// the versions olds (any may be nil: the Service did not exist) to cur
// (nil: deleted) in a way that leaves stale entries.
func (f *conntrackFilter) addChange(olds []*portal.Service, cur *portal.Service) {
	byVersion := make([]map[portal.PortKey]*portal.Portal, len(olds))
	curs := portalsByKey(cur)
	keys := map[portal.PortKey]struct{}{}
	for i, o := range olds {
		byVersion[i] = portalsByKey(o)
		for key := range byVersion[i] {
			keys[key] = struct{}{}
		}
	}
	for key := range curs {
		keys[key] = struct{}{}
	}
	ports := make([]*portal.Portal, len(olds))
	for key := range keys {
		for i, m := range byVersion {
			ports[i] = m[key] // nil where the version lacks the port
		}
		f.addPort(ports, curs[key])
	}
}

// addPort adds one Service port's destinations when its change from the
// versions olds (nil: the port did not exist) to c (nil: removed) can leave
// stale entries: a serving endpoint of some version that c does not have
// serving (flows DNATed to it), DNAT targets in c after a version without
// (flows recorded un-NATed while none was a target), an address or
// NodePort of some version that c lacks.
func (f *conntrackFilter) addPort(olds []*portal.Portal, c *portal.Portal) {
	curEPs := servingSet(c)
	curVIPs := map[ctVIP]bool{}
	for _, v := range vipsOf(c) {
		curVIPs[v] = true
	}
	var curNP uint16
	either := c
	if c != nil {
		curNP = c.NodePort
	}
	var (
		lost, unserved bool
		goneVIPs       []ctVIP
		goneNPs        []uint16
	)
	for _, o := range olds {
		unserved = unserved || !balanced(o) // includes created and re-created
		for ep := range servingSet(o) {
			if _, ok := curEPs[ep]; !ok {
				lost = true
				break
			}
		}
		for _, v := range vipsOf(o) {
			if !curVIPs[v] && !slices.Contains(goneVIPs, v) {
				goneVIPs = append(goneVIPs, v)
			}
		}
		if o == nil {
			continue
		}
		if either == nil {
			either = o
		}
		if o.NodePort != 0 && o.NodePort != curNP && !slices.Contains(goneNPs, o.NodePort) {
			goneNPs = append(goneNPs, o.NodePort)
		}
	}
	became := balanced(c) && unserved
	if either == nil || (!lost && !became && len(goneVIPs) == 0 && len(goneNPs) == 0) {
		return
	}
	f.ports++
	family := either.Key.Family // every version shares the PortKey
	if family == portal.IPv6 {
		f.v6 = true
	} else {
		f.v4 = true
	}
	cur := &ctTarget{endpoints: curEPs, balanced: balanced(c)}
	gone := &ctTarget{endpoints: map[netip.AddrPort]struct{}{}}
	for v := range curVIPs {
		f.addVIP(v, cur)
	}
	for _, v := range goneVIPs {
		f.addVIP(v, gone)
	}
	if either.Key.Protocol == portal.SCTP {
		return // SCTP NodePorts: ports are not decoded
	}
	proto := uint8(either.Key.Protocol)
	if curNP != 0 {
		f.nodePorts[ctNodePort{proto, family, curNP}] = cur
	}
	for _, np := range goneNPs {
		if _, still := f.nodePorts[ctNodePort{proto, family, np}]; !still {
			f.nodePorts[ctNodePort{proto, family, np}] = gone
		}
	}
}

// addVIP records t for v; a destination already recorded keeps its current
// state (an address that moved between Services counts for its new one).
func (f *conntrackFilter) addVIP(v ctVIP, t *ctTarget) {
	if have, ok := f.vips[v]; ok && (have.balanced || len(have.endpoints) > 0) {
		return
	}
	f.vips[v] = t
}

// scopeSCTP widens each SCTP destination to the endpoints of every SCTP
// port on that address: without ports, a flow to another SCTP port of the
// same address must not look stale.
func (f *conntrackFilter) scopeSCTP(sctp iter.Seq[*portal.Service]) {
	need := map[netip.Addr]*ctTarget{}
	for v, t := range f.vips {
		if v.proto == uint8(portal.SCTP) {
			need[v.addr] = t
		}
	}
	if len(need) == 0 {
		return
	}
	for svc := range sctp {
		for _, p := range svc.Portals {
			if p.Key.Protocol != portal.SCTP {
				continue
			}
			for _, v := range vipsOf(p) {
				t, ok := need[v.addr]
				if !ok {
					continue
				}
				eps := servingSet(p)
				if len(eps) > 0 {
					merged := &ctTarget{endpoints: map[netip.AddrPort]struct{}{}, balanced: t.balanced}
					for ep := range t.endpoints {
						merged.endpoints[ep] = struct{}{}
					}
					for ep := range eps {
						merged.endpoints[ep] = struct{}{}
					}
					need[v.addr] = merged
					f.vips[ctVIP{uint8(portal.SCTP), v.addr, 0}] = merged
				}
			}
		}
	}
}
