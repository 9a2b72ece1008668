// Package portalfuzz turns fuzzer input into desired state for the
// backends' fuzz tests, and existing test cases into fuzzer input (seeds).
//
// The Services it decodes keep the promises of package portal, as the
// builder hands them to a backend: portals sorted by key, one per key;
// addresses of the portal's family, sorted and unique; ports above 0; no
// two portals of a Service on one address and port. A finding is then a bug
// of the backend, not of its input. Services may still claim what another
// Service has: backends must cope with that. Only tests import it.
package portalfuzz

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/portal"
)

// Limits keep one input small and its values within what the apiserver
// allows (name lengths).
const (
	maxServices  = 12
	maxPortals   = 4
	maxAddrs     = 4
	maxEndpoints = 8
	maxNameLen   = 63 // namespaces and Service names: DNS labels
	maxPortName  = 15
)

// Schedulers are what the scheduler byte picks from ("" is the default).
var schedulers = []string{"", "rr", "wrr", "lc", "wlc", "sh", "mh"}

// Decode reads Services from data until it runs out. Names and addresses
// come from small pools most of the time, so that Services meet on the same
// addresses and keys; a tag byte selects raw bytes instead.
func Decode(data []byte) map[portal.ServiceKey]*portal.Service {
	r := &Reader{b: data}
	out := map[portal.ServiceKey]*portal.Service{}
	for len(out) < maxServices && r.More() {
		s := decodeService(r)
		if s != nil {
			out[s.Key] = s
		}
	}
	return out
}

func decodeService(r *Reader) *portal.Service {
	k := portal.ServiceKey{Namespace: r.name(maxNameLen), Name: r.name(maxNameLen)}
	if k.Name == "" {
		k.Name = "s"
	}
	s := &portal.Service{Key: k}
	type way struct {
		addr  netip.Addr
		proto portal.Protocol
		port  uint16
	}
	ways := map[way]bool{}
	taken := func(a netip.Addr, proto portal.Protocol, port uint16) bool {
		w := way{a, proto, port}
		if ways[w] {
			return true
		}
		ways[w] = true
		return false
	}
	keys := map[portal.PortKey]bool{}
	n := int(r.Byte()) % (maxPortals + 1)
	for range n {
		p := decodePortal(r, k)
		if p == nil || keys[p.Key] {
			continue
		}
		keys[p.Key] = true
		keep := func(as []netip.Addr) []netip.Addr {
			return slices.DeleteFunc(as, func(a netip.Addr) bool { return taken(a, p.Key.Protocol, p.Port) })
		}
		p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs = keep(p.ClusterIPs), keep(p.ExternalIPs), keep(p.LoadBalancerIPs)
		if p.NodePort != 0 && taken(netip.Addr{}, p.Key.Protocol, p.NodePort) {
			p.NodePort = 0
		}
		if !p.ExternalLocal || !p.HasExternal() {
			p.HealthCheckNodePort = 0
		}
		s.Portals = append(s.Portals, p)
	}
	slices.SortFunc(s.Portals, func(a, b *portal.Portal) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	return s
}

// Portal flags.
const (
	flagIPv6 = 1 << iota
	flagUDP
	flagSCTP
	flagExternalLocal
	flagInternalLocal
	flagNodePort
	flagAffinity
	flagHealthCheck
)

func decodePortal(r *Reader, k portal.ServiceKey) *portal.Portal {
	flags := r.Byte()
	f := portal.IPv4
	if flags&flagIPv6 != 0 {
		f = portal.IPv6
	}
	proto := portal.TCP
	switch {
	case flags&flagSCTP != 0:
		proto = portal.SCTP
	case flags&flagUDP != 0:
		proto = portal.UDP
	}
	p := &portal.Portal{
		Key:           portal.PortKey{Service: k, Port: r.name(maxPortName), Protocol: proto, Family: f},
		Port:          r.U16(),
		ExternalLocal: flags&flagExternalLocal != 0,
		InternalLocal: flags&flagInternalLocal != 0,
	}
	if flags&flagNodePort != 0 {
		p.NodePort = r.U16()
	}
	if flags&flagAffinity != 0 {
		p.Affinity.TimeoutSeconds = r.U32()
	}
	if flags&flagHealthCheck != 0 {
		p.HealthCheckNodePort = r.U16()
	}
	p.Scheduler = schedulers[int(r.Byte())%len(schedulers)]
	if p.Port == 0 {
		return nil
	}
	p.ClusterIPs = r.addrs(f, 2)
	p.ExternalIPs = r.addrs(f, maxAddrs)
	p.LoadBalancerIPs = r.addrs(f, maxAddrs)
	for range int(r.Byte()) % (maxAddrs + 1) {
		a := r.Addr(f)
		if !a.IsValid() {
			continue
		}
		pre := netip.PrefixFrom(a, int(r.Byte())%(a.BitLen()+1)).Masked()
		p.SourceRanges = append(p.SourceRanges, pre)
	}
	slices.SortFunc(p.SourceRanges, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	p.SourceRanges = slices.Compact(p.SourceRanges)
	p.ClusterEndpoints = r.endpoints(f)
	p.LocalEndpoints = r.endpoints(f)
	if p.ExternalLocal || p.InternalLocal {
		ready := map[netip.Addr]bool{}
		for _, e := range p.LocalEndpoints {
			ready[e.Addr()] = true
		}
		p.LocalReady = min(len(ready), int(r.Byte()))
	} else {
		p.LocalEndpoints = nil
	}
	return p
}

// Reader hands out the bytes of a fuzzer input; past its end, zeros.
type Reader struct{ b []byte }

// NewReader reads data.
func NewReader(data []byte) *Reader { return &Reader{b: data} }

// More reports whether bytes are left.
func (r *Reader) More() bool { return len(r.b) > 0 }

// Byte reads one byte.
func (r *Reader) Byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// U16 reads a big-endian uint16.
func (r *Reader) U16() uint16 { return uint16(r.Byte())<<8 | uint16(r.Byte()) }

// U32 reads a big-endian uint32.
func (r *Reader) U32() uint32 { return uint32(r.U16())<<16 | uint32(r.U16()) }

const nameChars = "abcdefghijklmnopqrstuvwxyz0123456789-"

func (r *Reader) name(max int) string {
	n := int(r.Byte()) % (max + 1)
	var sb strings.Builder
	for range n {
		sb.WriteByte(nameChars[int(r.Byte())%len(nameChars)])
	}
	return sb.String()
}

// Address tags: below rawTag, an address from one of four small pools
// (tag>>5&3) with tag&31 as its last byte; rawTag, the address's bytes.
const rawTag = 0xff

var pools = [2][4]netip.Addr{
	{netip.MustParseAddr("10.96.0.0"), netip.MustParseAddr("203.0.113.0"), netip.MustParseAddr("10.244.1.0"), netip.MustParseAddr("198.51.100.0")},
	{netip.MustParseAddr("fd00:96::"), netip.MustParseAddr("2001:db8:113::"), netip.MustParseAddr("fd00:244:1::"), netip.MustParseAddr("2001:db8:100::")},
}

// Addr reads an address of family f; the zero Addr when the bytes do not
// make a usable one (unspecified, or IPv4-mapped for IPv6).
func (r *Reader) Addr(f portal.Family) netip.Addr {
	tag := r.Byte()
	var a netip.Addr
	if tag != rawTag {
		base := pools[0][tag>>5&3]
		if f == portal.IPv6 {
			base = pools[1][tag>>5&3]
		}
		b := base.AsSlice()
		b[len(b)-1] = tag&31 + 1
		a, _ = netip.AddrFromSlice(b)
	} else if f == portal.IPv4 {
		a = netip.AddrFrom4([4]byte{r.Byte(), r.Byte(), r.Byte(), r.Byte()})
	} else {
		var b [16]byte
		for i := range b {
			b[i] = r.Byte()
		}
		a = netip.AddrFrom16(b)
	}
	if a.IsUnspecified() || a.Is4In6() {
		return netip.Addr{}
	}
	return a
}

func (r *Reader) addrs(f portal.Family, max int) []netip.Addr {
	var out []netip.Addr
	for range int(r.Byte()) % (max + 1) {
		if a := r.Addr(f); a.IsValid() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func (r *Reader) endpoints(f portal.Family) []netip.AddrPort {
	var out []netip.AddrPort
	for range int(r.Byte()) % (maxEndpoints + 1) {
		a, port := r.Addr(f), r.U16()
		if a.IsValid() && port != 0 {
			out = append(out, netip.AddrPortFrom(a, port))
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}
