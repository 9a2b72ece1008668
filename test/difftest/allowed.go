package difftest

import (
	"net/netip"
	"strings"
)

// allowance is a difference between the twins that does not fail the
// test: a deliberate one (docs/difftest.md says why) or one known and under
// investigation. match sees the case and the difference.
type allowance struct {
	Name   string
	Reason string
	match  func(c *Case, d difference) bool
}

// deliberate lists where onehop differs from kube-proxy on purpose. Each
// entry has a line in docs/difftest.md.
var deliberate = []allowance{{
	Name: "externalIP outside --external-ip-cidrs",
	Reason: "onehop serves spec.externalIPs only inside --external-ip-cidrs (none by default; CVE-2020-8554); " +
		"kube-proxy serves any address a Service claims",
	match: func(_ *Case, d difference) bool {
		return strings.HasPrefix(d.Probe.To.Way, "externalIP") &&
			!inPrefix(d.Probe.To.Addr, allowedExternalCIDR) && !inPrefix(d.Probe.To.Addr, allowedExternalCIDR6)
	},
}, {
	Name: "UDP flows that would outlive their Service",
	Reason: "a UDP flow open while its Service is deleted, or through a NodePort of a Service left with no serving " +
		"endpoint, keeps its pod under kube-proxy (it leaves the conntrack entry) and is cut under onehop (it " +
		"deletes the entry): a UDP flow must not outlive its Service",
	match: func(c *Case, d difference) bool {
		to := d.Probe.To
		if to.Proto != "udp" || to.Flow == "" || !d.Outcomes[0].equal(outcome{"kept its pod"}) {
			return false
		}
		s := c.service(to.Service)
		return s == nil || strings.HasPrefix(to.Way, "NodePort") && !s.serving()
	},
}}

// knownDifferences lists differences the tester found that are not yet
// fixed or decided. Each reason starts "under investigation:" and says
// what differs; an entry goes when its fix lands (with its minimal case as
// a regression test) or moves to deliberate.
var knownDifferences = []allowance{}

// allowed returns the allowance d falls under, or nil.
func allowed(c *Case, d difference) *allowance {
	for _, list := range [][]allowance{deliberate, knownDifferences} {
		for i := range list {
			if list[i].match(c, d) {
				return &list[i]
			}
		}
	}
	return nil
}

func inPrefix(hostPort, prefix string) bool {
	host := hostPort
	if i := strings.LastIndex(hostPort, ":"); i > 0 {
		host = strings.Trim(hostPort[:i], "[]")
	}
	a, err := netip.ParseAddr(host)
	return err == nil && netip.MustParsePrefix(prefix).Contains(a)
}

// serving reports whether some endpoint of s serves (an unset condition
// counts as serving, as kube-proxy reads it).
func (s *ServiceCase) serving() bool {
	for _, e := range s.Endpoints {
		if e.Serving == nil || *e.Serving {
			return true
		}
	}
	return false
}
