package l2

import (
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// Probe asks the segment whether another host answers for ips before this
// responder takes them over: an RFC 5227 ARP probe (sender address
// 0.0.0.0) for an IPv4 address, a neighbour solicitation for an IPv6 one,
// on every interface. It waits wait for the answers and returns, for
// each IP another host answered for, that host's link-layer address. The
// IPs need not be owned; owning them meanwhile answers nothing here.
func (r *Responder) Probe(ips []netip.Addr, wait time.Duration) map[netip.Addr]net.HardwareAddr {
	if len(ips) == 0 {
		return nil
	}
	r.mu.Lock()
	if r.probing == nil {
		r.probing = map[netip.Addr]net.HardwareAddr{}
	}
	for _, ip := range ips {
		r.probing[ip.Unmap()] = nil
	}
	r.mu.Unlock()
	for _, l := range r.links {
		l.mu.Lock()
		s := l.s
		l.mu.Unlock()
		if s == nil {
			continue
		}
		for _, ip := range ips {
			probeOn(s, ip.Unmap(), r)
		}
	}
	select {
	case <-time.After(wait):
	case <-r.done:
	}
	out := map[netip.Addr]net.HardwareAddr{}
	r.mu.Lock()
	for _, ip := range ips {
		if mac := r.probing[ip.Unmap()]; mac != nil {
			out[ip.Unmap()] = mac
		}
		delete(r.probing, ip.Unmap())
	}
	r.mu.Unlock()
	return out
}

func probeOn(s *sockets, ip netip.Addr, r *Responder) {
	if ip.Is4() && s.arp != nil {
		p, err := arp.NewPacket(arp.OperationRequest, s.ifi.HardwareAddr, netip.IPv4Unspecified(), make(net.HardwareAddr, len(s.ifi.HardwareAddr)), ip)
		if err == nil {
			err = s.arp.WriteTo(p, ethernet.Broadcast)
		}
		if err != nil {
			r.log.Warn("l2: ARP probe", "iface", s.ifi.Name, "ip", ip, "err", err)
		}
	}
	if ip.Is6() && s.ndp != nil {
		group, err := ndp.SolicitedNodeMulticast(ip)
		if err == nil {
			ns := &ndp.NeighborSolicitation{TargetAddress: ip,
				Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: s.ifi.HardwareAddr}}}
			err = s.ndp.WriteTo(ns, nil, group)
		}
		if err != nil {
			r.log.Warn("l2: neighbour solicitation probe", "iface", s.ifi.Name, "ip", ip, "err", err)
		}
	}
}

// answered notes mac answering a probe for ip; reports whether ip is
// being probed.
func (r *Responder) answered(ip netip.Addr, mac net.HardwareAddr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.probing[ip]; !ok {
		return false
	}
	if r.probing[ip] == nil {
		r.probing[ip] = mac
	}
	return true
}
