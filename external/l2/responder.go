package l2

import (
	"errors"
	"fmt"
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
type Responder struct {
	log    *slog.Logger
	ifaces []*link

	mu    sync.Mutex
	owned map[netip.Addr]bool
	wg    sync.WaitGroup
	done  chan struct{}
}

type link struct {
	ifi *net.Interface
	arp *arp.Client // nil without an IPv4 address
	ndp *ndp.Conn   // nil without an IPv6 link-local address
	// joined solicited-node groups, refcounted by owned IP
	groups map[netip.Addr]int
}

// NewResponder opens raw sockets on the named interfaces and starts
// answering (for nothing until Set).
func NewResponder(ifnames []string, log *slog.Logger) (*Responder, error) {
	if len(ifnames) == 0 {
		return nil, errors.New("l2: no interface")
	}
	r := &Responder{log: log, owned: map[netip.Addr]bool{}, done: make(chan struct{})}
	for _, name := range ifnames {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("l2: interface %s: %w", name, err)
		}
		l := &link{ifi: ifi, groups: map[netip.Addr]int{}}
		if c, err := arp.Dial(ifi); err == nil {
			l.arp = c
		} else {
			log.Info("l2: no ARP on interface", "iface", name, "err", err)
		}
		if c, _, err := ndp.Listen(ifi, ndp.LinkLocal); err == nil {
			l.ndp = c
		} else {
			log.Info("l2: no NDP on interface", "iface", name, "err", err)
		}
		if l.arp == nil && l.ndp == nil {
			r.Close()
			return nil, fmt.Errorf("l2: interface %s has neither an IPv4 address nor an IPv6 link-local address (or CAP_NET_RAW is missing)", name)
		}
		r.ifaces = append(r.ifaces, l)
	}
	for _, l := range r.ifaces {
		if l.arp != nil {
			r.wg.Add(1)
			go r.serveARP(l)
		}
		if l.ndp != nil {
			r.wg.Add(1)
			go r.serveNDP(l)
		}
	}
	return r, nil
}

func (r *Responder) owns(ip netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owned[ip]
}

// Set makes the responder answer for exactly ips; IPs it did not own before
// are announced gratuitously (ARP request form, unsolicited NA).
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
		r.announce(ip)
	}
}

// Reannounce announces owned IPs gratuitously again, now and once more a
// second later (a peer's stale announcement may still be in flight). IPs
// not owned by then are skipped.
func (r *Responder) Reannounce(ips []netip.Addr) {
	send := func() {
		for _, ip := range ips {
			if r.owns(ip.Unmap()) {
				r.log.Info("l2 re-announce", "ip", ip)
				r.announce(ip.Unmap())
			}
		}
	}
	if len(ips) == 0 {
		return
	}
	send()
	time.AfterFunc(time.Second, send)
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
	for _, l := range r.ifaces {
		if l.ndp == nil {
			continue
		}
		if l.groups[g]++; l.groups[g] == 1 {
			if err := l.ndp.JoinGroup(g); err != nil {
				r.log.Warn("l2: join solicited-node group", "iface", l.ifi.Name, "group", g, "err", err)
			}
		}
	}
}

func (r *Responder) leave(ip netip.Addr) {
	g, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return
	}
	for _, l := range r.ifaces {
		if l.ndp == nil || l.groups[g] == 0 {
			continue
		}
		if l.groups[g]--; l.groups[g] == 0 {
			delete(l.groups, g)
			_ = l.ndp.LeaveGroup(g)
		}
	}
}

// announce sends a gratuitous ARP / unsolicited NA on every interface.
func (r *Responder) announce(ip netip.Addr) {
	for _, l := range r.ifaces {
		if ip.Is4() && l.arp != nil {
			p, err := arp.NewPacket(arp.OperationRequest, l.ifi.HardwareAddr, ip, ethernet.Broadcast, ip)
			if err == nil {
				err = l.arp.WriteTo(p, ethernet.Broadcast)
			}
			if err != nil {
				r.log.Warn("l2: gratuitous ARP", "iface", l.ifi.Name, "ip", ip, "err", err)
			}
		}
		if ip.Is6() && l.ndp != nil {
			na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: ip,
				Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: l.ifi.HardwareAddr}}}
			if err := l.ndp.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
				r.log.Warn("l2: unsolicited NA", "iface", l.ifi.Name, "ip", ip, "err", err)
			}
		}
	}
}

func (r *Responder) closed() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *Responder) serveARP(l *link) {
	defer r.wg.Done()
	for {
		p, _, err := l.arp.Read()
		if err != nil {
			if r.closed() {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // not ARP, or malformed
		}
		if p.Operation != arp.OperationRequest || !r.owns(p.TargetIP) {
			continue
		}
		if err := l.arp.Reply(p, l.ifi.HardwareAddr, p.TargetIP); err != nil {
			r.log.Warn("l2: ARP reply", "iface", l.ifi.Name, "err", err)
		}
	}
}

func (r *Responder) serveNDP(l *link) {
	defer r.wg.Done()
	for {
		m, _, src, err := l.ndp.ReadFrom()
		if err != nil {
			if r.closed() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ns, ok := m.(*ndp.NeighborSolicitation)
		if !ok || !r.owns(ns.TargetAddress) {
			continue
		}
		na := &ndp.NeighborAdvertisement{Solicited: true, Override: true, TargetAddress: ns.TargetAddress,
			Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: l.ifi.HardwareAddr}}}
		dst := src
		if !src.IsValid() || src.IsUnspecified() { // duplicate address detection
			na.Solicited = false
			dst = netip.IPv6LinkLocalAllNodes()
		}
		if err := l.ndp.WriteTo(na, nil, dst); err != nil {
			r.log.Warn("l2: NA", "iface", l.ifi.Name, "err", err)
		}
	}
}

// Close stops answering. Neighbours keep their cache entries until the next
// owner's gratuitous announcement replaces them.
func (r *Responder) Close() {
	select {
	case <-r.done:
		return
	default:
	}
	close(r.done)
	for _, l := range r.ifaces {
		if l.arp != nil {
			_ = l.arp.SetReadDeadline(time.Now())
			_ = l.arp.Close()
		}
		if l.ndp != nil {
			_ = l.ndp.SetReadDeadline(time.Now())
			_ = l.ndp.Close()
		}
	}
	r.wg.Wait()
}
