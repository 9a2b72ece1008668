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
	var err error
	if pl.VIPs, err = b.dummyVIPs(); err != nil {
		return nil, err
	}
	pl.Filter = filterState{Sets: map[string]bool{}, VIPs: map[netip.Addr]bool{}, Ports: map[vsKey]bool{}}
	if err := b.sets.read(pl); err != nil {
		return nil, err
	}
	ours, foreign, err := b.listServers(b.namesLocked(), pl.VIPs)
	if err != nil {
		return nil, err
	}
	for _, ks := range ours {
		pl.Servers[ks.vs.Key] = ks.vs
	}
	pl.Foreign = foreign
	return pl, nil
}

// kernelServer is one of onehop's virtual servers in the kernel: as the
// kernel lists it (with its counters) and as onehop reads it.
type kernelServer struct {
	svc *libipvs.Service
	vs  *virtualServer
}

// listServers reads the kernel's virtual servers at an address and port.
// Those named in names (the state file) or at one of vips (the dummy's
// addresses) are onehop's; foreign are the keys of the others.
func (b *Backend) listServers(names map[string]stateEntry, vips map[netip.Addr]bool) (ours []kernelServer, foreign []vsKey, err error) {
	svcs, err := b.ipvs.GetServices()
	if err != nil {
		return nil, nil, fmt.Errorf("ipvs: listing services: %w", err)
	}
	for _, s := range svcs {
		v, err := b.readServer(s)
		if err != nil {
			return nil, nil, err
		}
		if v == nil {
			continue
		}
		if _, named := names[v.Key.String()]; !named && !vips[v.Key.Addr] {
			foreign = append(foreign, v.Key) // not onehop's
			continue
		}
		ours = append(ours, kernelServer{svc: s, vs: v})
	}
	return ours, foreign, nil
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
	v := fromService(vsKey{Proto: portal.Protocol(s.Protocol), Addr: addr.Unmap(), Port: s.Port}, s)
	ds, err := b.ipvs.GetDestinations(s)
	if err != nil {
		return nil, fmt.Errorf("ipvs: destinations of %s: %w", v.Key, err)
	}
	for _, d := range ds {
		if ap, ok := destAddr(d); ok {
			v.Dests[ap] = d.Weight
		}
	}
	return v, nil
}
