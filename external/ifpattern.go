package external

import (
	"fmt"
	"net"
	"regexp"
	"slices"
)

// withPatterns adds to names the node's interfaces that match one of
// patterns (an L2Advertisement's interfacePattern, anchored at both ends),
// as they are now. Patterns that match nothing are an error, so that the
// responder's start fails and is tried again, when the interface may have
// come.
func withPatterns(names, patterns []string) ([]string, error) {
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
