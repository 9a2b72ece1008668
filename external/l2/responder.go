package l2

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// Responder answers ARP and NDP for the IPs it owns.
//
// It announces an IP it takes over gratuitously in a burst (announceTimes
// rounds, announceEvery apart), each round in both ARP forms (request and
// reply) or as an unsolicited neighbour advertisement, as MetalLB does: a
// neighbour that missed one, or ignored one within its locktime, still
// moves.
//
// It listens for other hosts announcing the IPs it answers for (an ARP
// packet whose sender is the IP, a neighbour advertisement for it) from a
// link-layer address not its own, and tells the callback set with
// OnConflict, so that the lower-ranked of two answering nodes yields.
//
// It follows its interfaces by name: when one is deleted and created again
// (a bond or VLAN rebuilt, with a new index and maybe a new MAC address), or
// gains the IPv4 or link-local address it lacked, the responder opens new
// sockets on it and announces its IPs there again. Netlink link and address
// updates say when; a read error and a periodic check back them up.
type Responder struct {
	log       *slog.Logger
	links     []*link
	closeOnce sync.Once

	mu    sync.Mutex
	owned map[netip.Addr]bool
	// onConflict is told of another host announcing an owned IP, at most
	// once per conflictEvery per IP (lastConflict).
	onConflict   func(ip netip.Addr, from net.HardwareAddr)
	lastConflict map[netip.Addr]time.Time
	// probing are the IPs Probe asks about, with the first other host
	// that answered (nil: none yet).
	probing map[netip.Addr]net.HardwareAddr
	wg      sync.WaitGroup // the watcher
	done    chan struct{}
	kick    chan struct{} // look at the interfaces again now
}

// link is one interface the responder answers on, by name.
type link struct {
	name string

	mu sync.Mutex
	s  *sockets // nil while the interface is missing or has no usable address
	// solicited-node groups wanted, refcounted by owned IP; joined on
	// every new set of sockets
	groups map[netip.Addr]int
}

// sockets are the raw sockets open on one incarnation of an interface.
type sockets struct {
	ifi *net.Interface
	arp *arp.Client // nil without an IPv4 address
	ndp *ndp.Conn   // nil without an IPv6 link-local address
	wg  sync.WaitGroup
	// closing ends the goroutines reading the sockets
	closing chan struct{}
}

// recheckEvery backs up the netlink updates (which can be lost when the
// kernel's buffer overflows).
const recheckEvery = 10 * time.Second

// The gratuitous burst: announceTimes rounds, announceEvery apart (past
// the 1 s locktime within which Linux ignores a new link-layer address).
const (
	announceEvery = 1100 * time.Millisecond
	announceTimes = 5
)

// conflictEvery bounds how often one IP's conflict is reported: a burst
// from another node is one conflict, not five.
const conflictEvery = 500 * time.Millisecond

// NewResponder opens raw sockets on the named interfaces and starts
// answering (for nothing until Set).
func NewResponder(ifnames []string, log *slog.Logger) (*Responder, error) {
	return newResponder(ifnames, log, nil)
}

// newResponder is NewResponder; opened (nil: none) is called once the
// sockets are open, before they are served.
func newResponder(ifnames []string, log *slog.Logger, opened func()) (*Responder, error) {
	if len(ifnames) == 0 {
		return nil, errors.New("l2: no interface")
	}
	r := &Responder{log: log, owned: map[netip.Addr]bool{}, lastConflict: map[netip.Addr]time.Time{}, done: make(chan struct{}), kick: make(chan struct{}, 1)}
	// Subscribed before the sockets open: an interface or address that
	// comes meanwhile or right after is an update the watcher gets, not
	// something the periodic check finds.
	u := subscribe(log)
	for _, name := range ifnames {
		s, err := openSockets(name, log)
		if err != nil {
			u.close()
			r.Close()
			return nil, err
		}
		l := &link{name: name, groups: map[netip.Addr]int{}, s: s}
		r.links = append(r.links, l)
	}
	if opened != nil {
		opened()
	}
	for _, l := range r.links {
		r.serve(l.s)
	}
	r.wg.Add(1)
	go r.watch(u)
	return r, nil
}

func (r *Responder) owns(ip netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owned[ip]
}

// Set makes the responder answer for exactly ips; IPs it did not own before
// are announced gratuitously, in a burst.
func (r *Responder) Set(ips []netip.Addr) {
	r.mu.Lock()
	want := map[netip.Addr]bool{}
	var gained []netip.Addr
	for _, ip := range ips {
		ip = ip.Unmap()
		want[ip] = true
		if !r.owned[ip] {
			gained = append(gained, ip)
		}
	}
	var lost []netip.Addr
	for ip := range r.owned {
		if !want[ip] {
			lost = append(lost, ip)
			delete(r.lastConflict, ip)
		}
	}
	r.owned = want
	r.mu.Unlock()
	for _, ip := range lost {
		r.log.Info("l2 release", "ip", ip)
		if ip.Is6() {
			r.leave(ip)
		}
	}
	for _, ip := range gained {
		r.log.Info("l2 take over", "ip", ip)
		if ip.Is6() {
			r.join(ip)
		}
	}
	r.burst(gained)
}

// Reannounce announces owned IPs gratuitously again, in a burst (a peer's
// stale announcement may still be in flight).
func (r *Responder) Reannounce(ips []netip.Addr) {
	for _, ip := range ips {
		if r.owns(ip.Unmap()) {
			r.log.Info("l2 re-announce", "ip", ip)
		}
	}
	r.burst(ips)
}

// burst announces ips now and every announceEvery after, announceTimes
// rounds in all; each round skips the IPs not owned by then, and the
// rounds end with the responder.
func (r *Responder) burst(ips []netip.Addr) {
	if len(ips) == 0 {
		return
	}
	ips = slices.Clone(ips)
	round := func() {
		select {
		case <-r.done:
			return
		default:
		}
		for _, ip := range ips {
			if ip = ip.Unmap(); r.owns(ip) {
				r.announce(ip)
			}
		}
	}
	round()
	for i := 1; i < announceTimes; i++ {
		time.AfterFunc(time.Duration(i)*announceEvery, round)
	}
}

// OnConflict sets the function told when another host announces an IP
// this responder answers for (see the type's comment); from is that
// host's link-layer address.
func (r *Responder) OnConflict(f func(ip netip.Addr, from net.HardwareAddr)) {
	r.mu.Lock()
	r.onConflict = f
	r.mu.Unlock()
}

// Up reports whether one of the interfaces it answers on is up and has a
// carrier: while none is, this node can answer for nothing.
func (r *Responder) Up() bool {
	for _, l := range r.links {
		ifi, err := net.InterfaceByName(l.name)
		if err == nil && ifi.Flags&net.FlagUp != 0 && ifi.Flags&net.FlagRunning != 0 {
			return true
		}
	}
	return false
}

// LinkAddrs returns the link-layer addresses the responder answers with
// now, one per interface it has sockets on.
func (r *Responder) LinkAddrs() []net.HardwareAddr {
	var out []net.HardwareAddr
	for _, l := range r.links {
		l.mu.Lock()
		if l.s != nil {
			out = append(out, l.s.ifi.HardwareAddr)
		}
		l.mu.Unlock()
	}
	return out
}

// heard notes a packet from mac announcing ip: an answer to a probe when
// ip is being probed, a conflict when ip is owned, unless mac is one of
// this responder's.
func (r *Responder) heard(s *sockets, ip netip.Addr, mac net.HardwareAddr) {
	ip = ip.Unmap()
	r.mu.Lock()
	_, probing := r.probing[ip]
	owned := r.owned[ip]
	r.mu.Unlock()
	// Most ARP packets on a segment are about other hosts' addresses.
	if !probing && !owned || len(mac) == 0 ||
		slices.ContainsFunc(r.LinkAddrs(), func(m net.HardwareAddr) bool { return bytes.Equal(m, mac) }) {
		return
	}
	if r.answered(ip, mac) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	f := r.onConflict
	report := r.owned[ip] && now.Sub(r.lastConflict[ip]) >= conflictEvery
	if report {
		r.lastConflict[ip] = now
	}
	r.mu.Unlock()
	if !report {
		return
	}
	r.log.Info("l2: another host announces an IP answered here", "ip", ip, "from", mac.String(), "iface", s.ifi.Name)
	if f != nil {
		f(ip, mac)
	}
}

// Owned returns the IPs answered for, sorted.
func (r *Responder) Owned() []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []netip.Addr
	for ip := range r.owned {
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func (r *Responder) join(ip netip.Addr) {
	g, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return
	}
	for _, l := range r.links {
		l.mu.Lock()
		if l.groups[g]++; l.groups[g] == 1 && l.s != nil && l.s.ndp != nil {
			if err := l.s.ndp.JoinGroup(g); err != nil {
				r.log.Warn("l2: join solicited-node group", "iface", l.name, "group", g, "err", err)
			}
		}
		l.mu.Unlock()
	}
}

func (r *Responder) leave(ip netip.Addr) {
	g, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return
	}
	for _, l := range r.links {
		l.mu.Lock()
		if l.groups[g] > 0 {
			if l.groups[g]--; l.groups[g] == 0 {
				delete(l.groups, g)
				if l.s != nil && l.s.ndp != nil {
					_ = l.s.ndp.LeaveGroup(g)
				}
			}
		}
		l.mu.Unlock()
	}
}

// announce sends a gratuitous ARP / unsolicited NA on every interface.
func (r *Responder) announce(ip netip.Addr) {
	for _, l := range r.links {
		l.mu.Lock()
		s := l.s
		l.mu.Unlock()
		if s != nil {
			announceOn(s, ip, r.log)
		}
	}
}

// announceOn sends one gratuitous announcement of ip on s: for IPv4 in
// both ARP forms, a request and a reply (neighbours differ in which they
// heed), both broadcast.
func announceOn(s *sockets, ip netip.Addr, log *slog.Logger) {
	if ip.Is4() && s.arp != nil {
		for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
			p, err := arp.NewPacket(op, s.ifi.HardwareAddr, ip, ethernet.Broadcast, ip)
			if err == nil {
				err = s.arp.WriteTo(p, ethernet.Broadcast)
			}
			if err != nil {
				log.Warn("l2: gratuitous ARP", "iface", s.ifi.Name, "ip", ip, "op", op, "err", err)
			}
		}
	}
	if ip.Is6() && s.ndp != nil {
		na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: ip,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: s.ifi.HardwareAddr}}}
		if err := s.ndp.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
			log.Warn("l2: unsolicited NA", "iface", s.ifi.Name, "ip", ip, "err", err)
		}
	}
}

// Close stops answering. Neighbours keep their cache entries until the next
// owner's gratuitous announcement replaces them. It may be called more than
// once, also at the same time: each call returns once it stopped.
func (r *Responder) Close() { r.closeOnce.Do(r.close) }

func (r *Responder) close() {
	close(r.done)
	r.wg.Wait() // the watcher opens no more sockets
	for _, l := range r.links {
		l.mu.Lock()
		s := l.s
		l.s = nil
		l.mu.Unlock()
		if s != nil {
			s.close()
		}
	}
}
