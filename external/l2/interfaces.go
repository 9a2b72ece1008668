package external

import (
	"fmt"
	"net"
	"net/netip"
)

// interfaceOf finds the local interface holding one of addrs (the node's
// InternalIP), where the L2 provider answers by default.
func interfaceOf(addrs []netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifi := range ifs {
		as, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			for _, want := range addrs {
				if ip.Unmap() == want {
					return ifi.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("l2: no local interface holds the node's addresses %v; set l2.interfaces", addrs)
}
