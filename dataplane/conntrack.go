package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
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
