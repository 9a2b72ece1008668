package ipvs

import (
	"net/netip"

	libipvs "github.com/moby/ipvs"
)

type libipvsDest = libipvs.Destination

func destString(d *libipvs.Destination) string {
	a, _ := netip.AddrFromSlice(d.Address)
	return netip.AddrPortFrom(a.Unmap(), d.Port).String()
}
