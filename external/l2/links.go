package l2

import (
	"bytes"
	"net"
	"time"

	"github.com/vishvananda/netlink"
)

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
