package ipvs

import (
	"net"
	"net/netip"
	"syscall"

	libipvs "github.com/moby/ipvs"
)

const (
	svcFlagPersistent    = 0x1 // IP_VS_SVC_F_PERSISTENT
	svcFlagHashed        = 0x2 // IP_VS_SVC_F_HASHED: the kernel's, on every listed virtual server
	svcFlagSchedFallback = 0x8 // IP_VS_SVC_F_SCHED1: sh-fallback, mh-fallback
)

func toService(v *virtualServer) *libipvs.Service {
	s := &libipvs.Service{Address: net.IP(v.Key.Addr.AsSlice()), Protocol: uint16(v.Key.Proto), Port: v.Key.Port,
		SchedName: v.Sched, AddressFamily: syscall.AF_INET, Netmask: 0xffffffff}
	if v.Key.Addr.Is6() {
		s.AddressFamily, s.Netmask = syscall.AF_INET6, 128
	}
	if v.Timeout > 0 {
		s.Flags, s.Timeout = svcFlagPersistent, v.Timeout
	}
	if v.Fallback {
		s.Flags |= svcFlagSchedFallback
	}
	return s
}

func toDest(d netip.AddrPort, weight int) *libipvs.Destination {
	fam := uint16(syscall.AF_INET)
	if d.Addr().Is6() {
		fam = syscall.AF_INET6
	}
	return &libipvs.Destination{Address: net.IP(d.Addr().AsSlice()), Port: d.Port(), Weight: weight,
		ConnectionFlags: libipvs.ConnectionFlagMasq, AddressFamily: fam}
}

// fromService is virtual server k as the kernel's s has it, without its
// destinations.
func fromService(k vsKey, s *libipvs.Service) *virtualServer {
	v := &virtualServer{Key: k, Sched: s.SchedName, Dests: map[netip.AddrPort]int{}}
	v.Fallback = s.Flags&svcFlagSchedFallback != 0
	if s.Flags&svcFlagPersistent != 0 {
		v.Timeout = s.Timeout
	}
	return v
}

// destAddr is d's address and port; false when d has no valid address.
func destAddr(d *libipvs.Destination) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(d.Address)
	return netip.AddrPortFrom(a.Unmap(), d.Port), ok
}

type libipvsDest = libipvs.Destination

func destString(d *libipvs.Destination) string {
	ap, _ := destAddr(d)
	return ap.String()
}
