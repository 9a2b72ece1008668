package l2

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
)

// InterfaceOf finds the local interface holding one of addrs (the node's
// InternalIP), where the L2 provider answers by default.
func InterfaceOf(addrs []netip.Addr) (string, error) {
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

// WithPatterns adds to names the node's interfaces that match one of
// patterns (an L2Advertisement's interfacePattern, anchored at both ends),
// as they are now. Patterns that match nothing are an error, so that the
// responder's start fails and is tried again, when the interface may have
// come.
func WithPatterns(names, patterns []string) ([]string, error) {
	if len(patterns) == 0 {
		return names, nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := slices.Clone(names)
	for _, p := range patterns {
		re, err := regexp.Compile("^(?:" + p + ")$")
		if err != nil {
			return nil, fmt.Errorf("interfacePattern %q: %w", p, err)
		}
		found := false
		for _, ifi := range ifs {
			if re.MatchString(ifi.Name) {
				out, found = append(out, ifi.Name), true
			}
		}
		if !found {
			return nil, fmt.Errorf("l2: no interface matches interfacePattern %q", p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
