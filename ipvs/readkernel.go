package ipvs

import (
	"fmt"
	"net/netip"
	"syscall"

	libipvs "github.com/moby/ipvs"

	"github.com/onehop/onehop/portal"
)

// readKernel reads the state onehop owns from the kernel: the IPVS services
// (those on its VIPs or NodePorts it recorded) and the dummy's addresses;
// Sync adds the iptables rules (readRules).
func (b *Backend) readKernel() (*plan, error) {
	pl := newPlan()
	vips, err := b.dummyAddrs()
	if err != nil {
		return nil, err
	}
	for _, a := range vips {
		pl.VIPs[a] = true
	}
	pl.Filter = filterState{Sets: map[string]bool{}, VIPs: map[netip.Addr]bool{}, Ports: map[vsKey]bool{}}
	if err := b.sets.read(pl); err != nil {
		return nil, err
	}
	names := b.namesLocked()
	svcs, err := b.ipvs.GetServices()
	if err != nil {
		return nil, fmt.Errorf("ipvs: listing services: %w", err)
	}
	for _, s := range svcs {
		v, err := b.readServer(s)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		if _, ours := names[v.Key.String()]; !ours && !pl.VIPs[v.Key.Addr] {
			pl.Foreign = append(pl.Foreign, v.Key) // not onehop's
			continue
		}
		pl.Servers[v.Key] = v
	}
	return pl, nil
}

func (b *Backend) readServer(s *libipvs.Service) (*virtualServer, error) {
	if s.FWMark != 0 {
		return nil, nil
	}
	addr, ok := netip.AddrFromSlice(s.Address)
	if !ok {
		return nil, nil
	}
	if s.AddressFamily == syscall.AF_INET {
		addr = addr.Unmap()
		if addr.Is6() { // moby/ipvs returns 16 bytes for some IPv4 services
			return nil, nil
		}
	}
	v := &virtualServer{Key: vsKey{Proto: portal.Protocol(s.Protocol), Addr: addr.Unmap(), Port: s.Port}, Sched: s.SchedName,
		Dests: map[netip.AddrPort]int{}}
	v.Fallback = s.Flags&svcFlagSchedFallback != 0
	if s.Flags&svcFlagPersistent != 0 {
		v.Timeout = s.Timeout
	}
	ds, err := b.ipvs.GetDestinations(s)
	if err != nil {
		return nil, fmt.Errorf("ipvs: destinations of %s: %w", v.Key, err)
	}
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		v.Dests[netip.AddrPortFrom(a.Unmap(), d.Port)] = d.Weight
	}
	return v, nil
}
