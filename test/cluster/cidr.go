package cluster

import (
	"fmt"
	"net/netip"
	"strings"
)

func splitComma(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// firstIP returns the first usable address of a CIDR: the apiserver gives it
// to the "kubernetes" Service, so it belongs in the serving certificate.
func firstIP(cidr string) ([]byte, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", cidr, err)
	}
	return p.Masked().Addr().Next().AsSlice(), nil
}
