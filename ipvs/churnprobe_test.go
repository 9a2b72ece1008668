package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"github.com/onehop/onehop/portal"
)

// churnProbe is one request from the client through a way in.
type churnProbe struct {
	w       way
	addr    string
	allowed map[string]bool // pod names that may answer
	denied  bool            // source ranges leave the client out: dropped
	// keepSource: the pod must see the client's address; else the node's.
	keepSource bool
}

func podName(d netip.AddrPort) string {
	for i := 1; i <= churnPods; i++ {
		if d.Addr() == churnEPAddr(portal.FamilyOf(d.Addr()), i) {
			return fmt.Sprintf("pod-%d", i)
		}
	}
	return d.String()
}

// probes picks n ways in at random. Dropped ones are sampled less: each
// costs a timeout.
func (m *churnModel) probes(n int) []churnProbe {
	ways := m.ways()
	var out []churnProbe
	for range n * 3 {
		if len(out) == n || len(ways) == 0 {
			break
		}
		w := ways[m.rng.IntN(len(ways))]
		client := netip.MustParseAddr(clientIP)
		if w.key.family() == portal.IPv6 {
			client = netip.MustParseAddr(clientIP6)
		}
		p := churnProbe{w: w, addr: netip.AddrPortFrom(w.key.Addr, w.key.Port).String(), allowed: map[string]bool{}}
		if w.lb || (w.nodePort && w.svc.lb && m.cfg.SourceRangesOnNodePorts) {
			rs := ofFamily(w.svc.ranges, w.key.family())
			p.denied = len(rs) > 0 && !slices.ContainsFunc(rs, func(r netip.Prefix) bool { return r.Contains(client) })
		}
		if p.denied && m.rng.IntN(4) != 0 {
			continue
		}
		for _, d := range w.eps {
			p.allowed[podName(d)] = true
		}
		// The pod sees the client under the Local policy, and on cluster
		// IPs when nothing masquerades by default.
		p.keepSource = (w.external && w.svc.extLocal) ||
			(!w.external && len(m.cfg.ClusterCIDRs) == 0 && !m.cfg.MasqueradeAll)
		out = append(out, p)
	}
	return out
}

func (p churnProbe) run(n *testNet) string {
	what := fmt.Sprintf("%s %s (%v, endpoints %v)", p.w.key.Proto, p.addr, p.w.svc.key, p.w.eps)
	var pod, src string
	var err error
	if p.w.key.Proto == portal.UDP {
		pod, src, err = n.udp(n.client, p.addr)
	} else {
		var c *conn
		if c, err = n.dial(n.client, p.addr); err == nil {
			c.Close()
			pod, src = c.Pod, c.Source
		}
	}
	switch {
	case p.denied:
		if err == nil {
			return fmt.Sprintf("%s: answered by %s, but the source ranges leave the client out", what, pod)
		}
	case len(p.allowed) == 0:
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Sprintf("%s: no endpoints, want connection refused, got %q %v", what, pod, err)
		}
	case err != nil:
		return fmt.Sprintf("%s: %v", what, err)
	case !p.allowed[pod]:
		return fmt.Sprintf("%s: answered by %s, not an endpoint", what, pod)
	case p.keepSource:
		if src != clientIP && src != clientIP6 {
			return fmt.Sprintf("%s: the pod saw %s instead of the client (Local policy, or nothing to masquerade)", what, src)
		}
	case src == clientIP || src == clientIP6:
		return fmt.Sprintf("%s: the pod saw the client's address, not masqueraded", what)
	}
	return ""
}
