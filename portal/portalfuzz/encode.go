package portalfuzz

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/portal"
)

// Encode writes Services so that Decode reads them back (names are mapped
// to lower-case letters, digits and '-', and cut to their limits; values
// beyond Decode's limits are left out): existing test cases become seeds.
func Encode(svcs map[portal.ServiceKey]*portal.Service) []byte {
	keys := make([]portal.ServiceKey, 0, len(svcs))
	for k := range svcs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b portal.ServiceKey) int { return strings.Compare(a.String(), b.String()) })
	w := &writer{}
	for _, k := range keys[:min(len(keys), maxServices)] {
		s := svcs[k]
		w.name(k.Namespace, maxNameLen)
		w.name(k.Name, maxNameLen)
		ps := s.Portals[:min(len(s.Portals), maxPortals)]
		w.byte(byte(len(ps)))
		for _, p := range ps {
			w.portal(p)
		}
	}
	return w.b
}

type writer struct{ b []byte }

func (w *writer) byte(c byte)  { w.b = append(w.b, c) }
func (w *writer) u16(v uint16) { w.b = append(w.b, byte(v>>8), byte(v)) }
func (w *writer) u32(v uint32) { w.u16(uint16(v >> 16)); w.u16(uint16(v)) }
func (w *writer) addr(a netip.Addr) {
	w.byte(rawTag)
	w.b = append(w.b, a.Unmap().AsSlice()...)
}

func (w *writer) name(s string, max int) {
	s = s[:min(len(s), max)]
	w.byte(byte(len(s)))
	for _, c := range []byte(s) {
		i := strings.IndexByte(nameChars, c|0x20)
		if i < 0 {
			i = strings.IndexByte(nameChars, 'x')
		}
		w.byte(byte(i))
	}
}

func (w *writer) portal(p *portal.Portal) {
	var flags byte
	if p.Key.Family == portal.IPv6 {
		flags |= flagIPv6
	}
	switch p.Key.Protocol {
	case portal.UDP:
		flags |= flagUDP
	case portal.SCTP:
		flags |= flagSCTP
	}
	if p.ExternalLocal {
		flags |= flagExternalLocal
	}
	if p.InternalLocal {
		flags |= flagInternalLocal
	}
	if p.NodePort != 0 {
		flags |= flagNodePort
	}
	if p.Affinity.TimeoutSeconds != 0 {
		flags |= flagAffinity
	}
	if p.HealthCheckNodePort != 0 {
		flags |= flagHealthCheck
	}
	w.byte(flags)
	w.name(p.Key.Port, maxPortName)
	w.u16(p.Port)
	if p.NodePort != 0 {
		w.u16(p.NodePort)
	}
	if p.Affinity.TimeoutSeconds != 0 {
		w.u32(p.Affinity.TimeoutSeconds)
	}
	if p.HealthCheckNodePort != 0 {
		w.u16(p.HealthCheckNodePort)
	}
	w.byte(byte(max(slices.Index(schedulers, p.Scheduler), 0)))
	addrs := func(as []netip.Addr, max int) {
		as = as[:min(len(as), max)]
		w.byte(byte(len(as)))
		for _, a := range as {
			w.addr(a)
		}
	}
	addrs(p.ClusterIPs, 2)
	addrs(p.ExternalIPs, maxAddrs)
	addrs(p.LoadBalancerIPs, maxAddrs)
	srs := p.SourceRanges[:min(len(p.SourceRanges), maxAddrs)]
	w.byte(byte(len(srs)))
	for _, r := range srs {
		w.addr(r.Addr())
		w.byte(byte(r.Bits()))
	}
	eps := func(es []netip.AddrPort) {
		es = es[:min(len(es), maxEndpoints)]
		w.byte(byte(len(es)))
		for _, e := range es {
			w.addr(e.Addr())
			w.u16(e.Port())
		}
	}
	eps(p.ClusterEndpoints)
	eps(p.LocalEndpoints)
	if p.ExternalLocal || p.InternalLocal {
		w.byte(byte(min(p.LocalReady, 255)))
	}
}
