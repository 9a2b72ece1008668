package portal

import (
	"fmt"
	"net/netip"
	"slices"
)

// claim is one way into a Service that only one Service can have: an
// address, protocol and port, or (with no address) a NodePort.
type claim struct {
	addr  netip.Addr
	proto Protocol
	port  uint16
}

func (c claim) String() string {
	if !c.addr.IsValid() {
		return fmt.Sprintf("node port %d/%s", c.port, c.proto)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(c.addr, c.port), c.proto)
}

// claims keeps who holds each claim. The first Service to claim an address
// and port keeps it; a later one is refused with an event, and is built
// again when the holder lets go.
type claims struct {
	owner  map[claim]ServiceKey
	held   map[ServiceKey][]claim
	losers map[claim][]ServiceKey
}

func newClaims() *claims {
	return &claims{owner: map[claim]ServiceKey{}, held: map[ServiceKey][]claim{}, losers: map[claim][]ServiceKey{}}
}

// release drops everything k holds and returns the Services that lost one
// of those claims to k, which must be built again.
func (c *claims) release(k ServiceKey) []ServiceKey {
	var again []ServiceKey
	for _, cl := range c.held[k] {
		if c.owner[cl] == k {
			delete(c.owner, cl)
			again = append(again, c.losers[cl]...)
			delete(c.losers, cl)
		}
	}
	delete(c.held, k)
	return again
}

// take claims every way into svc, removing from its portals those another
// Service holds, and reports them as problems.
func (c *claims) take(svc *Service) []Problem {
	var problems []Problem
	k := svc.Key
	try := func(cl claim) bool {
		if o, ok := c.owner[cl]; ok && o != k {
			if !slices.Contains(c.losers[cl], k) {
				c.losers[cl] = append(c.losers[cl], k)
			}
			problems = append(problems, Problem{Service: k, Reason: ReasonPortConflict,
				Message: fmt.Sprintf("%s is already used by Service %s; not programmed", cl, o)})
			return false
		}
		if _, ok := c.owner[cl]; !ok {
			c.owner[cl] = k
			c.held[k] = append(c.held[k], cl)
		}
		return true
	}
	keep := func(ips []netip.Addr, proto Protocol, port uint16) []netip.Addr {
		var out []netip.Addr
		for _, ip := range ips {
			if try(claim{addr: ip, proto: proto, port: port}) {
				out = append(out, ip)
			}
		}
		return out
	}
	for _, p := range svc.Portals {
		proto := p.Key.Protocol
		p.ClusterIPs = keep(p.ClusterIPs, proto, p.Port)
		p.ExternalIPs = keep(p.ExternalIPs, proto, p.Port)
		p.LoadBalancerIPs = keep(p.LoadBalancerIPs, proto, p.Port)
		if p.NodePort != 0 && !try(claim{proto: proto, port: p.NodePort}) {
			p.NodePort = 0
		}
	}
	return problems
}
