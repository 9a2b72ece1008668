package l2

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
)

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

// readStops handles a read error of s's ARP or NDP socket: it reports
// whether the socket is closed, and the serving loop ends; a timeout is
// only the loop's chance to look at s again, and any other error is told.
func (r *Responder) readStops(s *sockets, err error) bool {
	if s.closed() || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	r.readFailed(s, err)
	return false
}

func (r *Responder) serveARP(s *sockets) {
	defer s.wg.Done()
	for {
		p, _, err := s.arp.Read()
		if err != nil {
			if r.readStops(s, err) {
				return
			}
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
			if r.readStops(s, err) {
				return
			}
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
