package l2

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
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
	if len(ifnames) == 0 {
		return nil, errors.New("l2: no interface")
	}
	r := &Responder{log: log, owned: map[netip.Addr]bool{}, lastConflict: map[netip.Addr]time.Time{}, done: make(chan struct{}), kick: make(chan struct{}, 1)}
	for _, name := range ifnames {
		s, err := openSockets(name, log)
		if err != nil {
			r.Close()
			return nil, err
		}
		l := &link{name: name, groups: map[netip.Addr]int{}, s: s}
		r.links = append(r.links, l)
	}
	for _, l := range r.links {
		r.serve(l.s)
	}
	r.wg.Add(1)
	go r.watch()
	return r, nil
}

// openSockets opens ARP and NDP sockets on the interface name now names.
func openSockets(name string, log *slog.Logger) (*sockets, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("l2: interface %s: %w", name, err)
	}
	s := &sockets{ifi: ifi, closing: make(chan struct{})}
	if c, err := arp.Dial(ifi); err == nil {
		s.arp = c
	} else {
		log.Info("l2: no ARP on interface", "iface", name, "err", err)
	}
	// The NDP socket names the interface by its index, not its name: Go
	// caches the name's index for up to a minute, and a recreated
	// interface has a new one.
	byIndex := *ifi
	byIndex.Name = strconv.Itoa(ifi.Index)
	if c, _, err := ndp.Listen(&byIndex, ndp.LinkLocal); err == nil {
		s.ndp = c
	} else {
		log.Info("l2: no NDP on interface", "iface", name, "err", err)
	}
	if s.arp == nil && s.ndp == nil {
		return nil, fmt.Errorf("l2: interface %s has neither an IPv4 address nor an IPv6 link-local address (or CAP_NET_RAW is missing)", name)
	}
	return s, nil
}

// serve starts answering on s.
func (r *Responder) serve(s *sockets) {
	if s.arp != nil {
		s.wg.Add(1)
		go r.serveARP(s)
	}
	if s.ndp != nil {
		s.wg.Add(1)
		go r.serveNDP(s)
	}
}

// close stops s's goroutines and closes its sockets.
func (s *sockets) close() {
	close(s.closing)
	if s.arp != nil {
		_ = s.arp.SetReadDeadline(time.Now())
		_ = s.arp.Close()
	}
	if s.ndp != nil {
		_ = s.ndp.SetReadDeadline(time.Now())
		_ = s.ndp.Close()
	}
	s.wg.Wait()
}

// watch follows the interfaces until Close.
func (r *Responder) watch() {
	defer r.wg.Done()
	var linkCh chan netlink.LinkUpdate
	var addrCh chan netlink.AddrUpdate
	var stop chan struct{} // ends the current subscriptions
	subscribe := func() {
		stop = make(chan struct{})
		mine := stop
		onErr := func(err error) {
			select {
			case <-mine: // unsubscribed
			default:
				r.log.Warn("l2: netlink updates lost; checking the interfaces every "+recheckEvery.String()+" until they resume", "err", err)
			}
		}
		linkCh, addrCh = make(chan netlink.LinkUpdate, 64), make(chan netlink.AddrUpdate, 64)
		if err := netlink.LinkSubscribeWithOptions(linkCh, stop, netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
			onErr(err)
			linkCh = nil
		}
		if err := netlink.AddrSubscribeWithOptions(addrCh, stop, netlink.AddrSubscribeOptions{ErrorCallback: onErr}); err != nil {
			onErr(err)
			addrCh = nil
		}
	}
	// unsubscribe ends the subscriptions; their goroutines end once they
	// have handed over what they read, so that is drained.
	unsubscribe := func() {
		close(stop)
		go drain(linkCh)
		go drain(addrCh)
		linkCh, addrCh = nil, nil
	}
	subscribe()
	defer unsubscribe()
	tick := time.NewTicker(recheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			return
		case u, ok := <-linkCh:
			if !ok {
				linkCh = nil
				continue
			}
			if r.follows(u.Attrs().Name, u.Attrs().Index) {
				r.refresh()
			}
		case u, ok := <-addrCh:
			if !ok {
				addrCh = nil
				continue
			}
			if r.follows("", u.LinkIndex) || r.incomplete() {
				r.refresh()
			}
		case <-r.kick:
			r.refresh()
		case <-tick.C:
			if linkCh == nil || addrCh == nil {
				unsubscribe()
				subscribe()
			}
			r.refresh()
		}
	}
}

// drain reads ch until it is closed (nil: nothing to read).
func drain[T any](ch chan T) {
	if ch != nil {
		for range ch {
		}
	}
}

// follows: an update about the interface name or index concerns a link.
func (r *Responder) follows(name string, index int) bool {
	for _, l := range r.links {
		l.mu.Lock()
		s := l.s
		l.mu.Unlock()
		if l.name == name || s != nil && s.ifi.Index == index {
			return true
		}
	}
	return false
}

// incomplete: a link lacks its interface or one of its protocols, which a
// new address may bring.
func (r *Responder) incomplete() bool {
	for _, l := range r.links {
		l.mu.Lock()
		s := l.s
		l.mu.Unlock()
		if s == nil || s.arp == nil || s.ndp == nil {
			return true
		}
	}
	return false
}

// refresh opens new sockets on every link whose interface is another than
// its sockets', or has gained an address they lack, and closes those of
// interfaces that are gone. Only the watcher calls it.
func (r *Responder) refresh() {
	for _, l := range r.links {
		l.mu.Lock()
		cur := l.s
		l.mu.Unlock()
		ifi, err := net.InterfaceByName(l.name)
		switch {
		case err != nil:
			if cur != nil {
				r.log.Warn("l2: interface gone; answering there again once it is back", "iface", l.name, "err", err)
				r.swap(l, nil)
			}
			continue
		case cur != nil && cur.ifi.Index == ifi.Index && bytes.Equal(cur.ifi.HardwareAddr, ifi.HardwareAddr) && !gained(cur, ifi):
			continue
		}
		s, err := openSockets(l.name, r.log)
		if err != nil {
			if cur != nil {
				r.swap(l, nil)
			}
			continue // an address or the link's coming up will bring us back
		}
		r.log.Info("l2: answering on a new incarnation of the interface", "iface", l.name, "index", s.ifi.Index, "mac", s.ifi.HardwareAddr.String(),
			"arp", s.arp != nil, "ndp", s.ndp != nil)
		r.swap(l, s)
		for _, ip := range r.Owned() {
			announceOn(s, ip, r.log)
		}
	}
}

// gained: ifi has an address for a protocol s has no socket for.
func gained(s *sockets, ifi *net.Interface) bool {
	if s.arp != nil && s.ndp != nil {
		return false
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if n.IP.To4() != nil && s.arp == nil || n.IP.To4() == nil && n.IP.IsLinkLocalUnicast() && s.ndp == nil {
			return true
		}
	}
	return false
}

// swap puts s (nil: none) in place of l's sockets, joins the wanted
// groups on s, starts answering on it and closes the old ones.
func (r *Responder) swap(l *link, s *sockets) {
	l.mu.Lock()
	old := l.s
	l.s = s
	if s != nil && s.ndp != nil {
		for g := range l.groups {
			if err := s.ndp.JoinGroup(g); err != nil {
				r.log.Warn("l2: join solicited-node group", "iface", l.name, "group", g, "err", err)
			}
		}
	}
	l.mu.Unlock()
	if s != nil {
		r.serve(s)
	}
	if old != nil {
		old.close()
	}
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

func (s *sockets) closed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// readFailed handles a read error that is neither a timeout nor the
// socket's closing: the interface may be gone (ENETDOWN), so the watcher
// looks again, and the reader pauses rather than spin.
func (r *Responder) readFailed(s *sockets, err error) {
	var oe *net.OpError
	if !errors.As(err, &oe) {
		return // a malformed packet
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
	select {
	case <-s.closing:
	case <-time.After(100 * time.Millisecond):
	}
}

func (r *Responder) serveARP(s *sockets) {
	defer s.wg.Done()
	for {
		p, _, err := s.arp.Read()
		if err != nil {
			if s.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			r.readFailed(s, err)
			continue
		}
		r.heard(s, p.SenderIP, p.SenderHardwareAddr)
		if p.Operation != arp.OperationRequest || !r.owns(p.TargetIP) {
			continue
		}
		if err := s.arp.Reply(p, s.ifi.HardwareAddr, p.TargetIP); err != nil {
			r.log.Warn("l2: ARP reply", "iface", s.ifi.Name, "err", err)
		}
	}
}

func (r *Responder) serveNDP(s *sockets) {
	defer s.wg.Done()
	for {
		m, _, src, err := s.ndp.ReadFrom()
		if err != nil {
			if s.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			r.readFailed(s, err)
			continue
		}
		if na, ok := m.(*ndp.NeighborAdvertisement); ok {
			for _, o := range na.Options {
				if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
					r.heard(s, na.TargetAddress, lla.Addr)
				}
			}
			continue
		}
		ns, ok := m.(*ndp.NeighborSolicitation)
		if !ok || !r.owns(ns.TargetAddress) {
			continue
		}
		na := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: ns.TargetAddress,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: s.ifi.HardwareAddr}}}
		dst := src
		if !src.IsValid() || src.IsUnspecified() { // duplicate address detection
			na.Solicited = false
			dst = netip.IPv6LinkLocalAllNodes()
		}
		if err := s.ndp.WriteTo(na, nil, dst); err != nil {
			r.log.Warn("l2: NA", "iface", s.ifi.Name, "err", err)
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
