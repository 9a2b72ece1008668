package l2

import (
	"bytes"
	"log/slog"
	"net"
	"time"

	"github.com/vishvananda/netlink"
)

// updates are the netlink link and address updates from the moment of
// subscribe on.
type updates struct {
	// nil: not subscribed (the subscription failed or ended)
	link chan netlink.LinkUpdate
	addr chan netlink.AddrUpdate
	stop chan struct{} // ends the subscriptions
}

// subscribe subscribes to netlink link and address updates; a
// subscription that fails is logged and left nil.
func subscribe(log *slog.Logger) *updates {
	stop := make(chan struct{})
	u := &updates{link: make(chan netlink.LinkUpdate, 64), addr: make(chan netlink.AddrUpdate, 64), stop: stop}
	onErr := func(err error) {
		select {
		case <-stop: // unsubscribed
		default:
			log.Warn("l2: netlink updates lost; checking the interfaces every "+recheckEvery.String()+" until they resume", "err", err)
		}
	}
	if err := netlink.LinkSubscribeWithOptions(u.link, stop, netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
		onErr(err)
		u.link = nil
	}
	if err := netlink.AddrSubscribeWithOptions(u.addr, stop, netlink.AddrSubscribeOptions{ErrorCallback: onErr}); err != nil {
		onErr(err)
		u.addr = nil
	}
	return u
}

// close ends the subscriptions; their goroutines end once they have
// handed over what they read, so that is drained.
func (u *updates) close() {
	close(u.stop)
	go drain(u.link)
	go drain(u.addr)
}

// watch follows the interfaces with u, subscribed before their sockets
// were first opened, until Close.
func (r *Responder) watch(u *updates) {
	defer r.wg.Done()
	defer func() { u.close() }() // the last subscription
	tick := time.NewTicker(recheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-r.done:
			return
		case lu, ok := <-u.link:
			if !ok {
				u.link = nil
				continue
			}
			if r.follows(lu.Attrs().Name, lu.Attrs().Index) {
				r.refresh()
			}
		case au, ok := <-u.addr:
			if !ok {
				u.addr = nil
				continue
			}
			if r.follows("", au.LinkIndex) || r.incomplete() {
				r.refresh()
			}
		case <-r.kick:
			r.refresh()
		case <-tick.C:
			if u.link == nil || u.addr == nil {
				u.close()
				u = subscribe(r.log)
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
