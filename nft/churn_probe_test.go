package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// What TestChurn checks after each sync: the ways in the kernel holds, and
// traffic through every way into the model's Services, with the endpoints
// that may answer.

// checkWaysIn compares every way into every portal of the model with the
// entries read back from the kernel, and checks that each portal's
// endpoints are among the model's.
func (m *churnModel) checkWaysIn(k *kernelTable) string {
	dump := k.dump()
	got := map[string]map[string]bool{}
	eps := map[string][]string{}
	for _, p := range dump.Ports {
		got[p.Service] = map[string]bool{}
		for _, e := range p.Entries {
			got[p.Service][e.Kind+" "+e.Addr] = true
		}
		for _, e := range p.Endpoints {
			eps[p.Service] = append(eps[p.Service], e.Addr)
		}
	}
	var problems []string
	seen := map[string]bool{}
	for _, svc := range m.built {
		for _, p := range svc.Portals {
			name := p.Key.String()
			seen[name] = true
			proto := p.Key.Protocol.String()
			want := map[string]bool{}
			for _, a := range p.ClusterIPs {
				want[fmt.Sprintf("%s %s/%s", entryClusterIP, netip.AddrPortFrom(a, p.Port), proto)] = true
			}
			for _, a := range p.ExternalIPs {
				want[fmt.Sprintf("%s %s/%s", entryExternalIP, netip.AddrPortFrom(a, p.Port), proto)] = true
			}
			for _, a := range p.LoadBalancerIPs {
				want[fmt.Sprintf("%s %s/%s", entryLoadBalancer, netip.AddrPortFrom(a, p.Port), proto)] = true
			}
			if p.NodePort != 0 {
				want[fmt.Sprintf("%s :%d/%s", entryNodePort, p.NodePort, proto)] = true
			}
			for w := range want {
				if !got[name][w] {
					problems = append(problems, fmt.Sprintf("%s: %s missing", name, w))
				}
			}
			for g := range got[name] {
				if !want[g] {
					problems = append(problems, fmt.Sprintf("%s: %s not wanted", name, g))
				}
			}
			allowed := map[string]bool{}
			for _, e := range append(slices.Clone(p.ClusterEndpoints), p.LocalEndpoints...) {
				allowed[e.String()] = true
			}
			for _, e := range eps[name] {
				if !allowed[e] {
					problems = append(problems, fmt.Sprintf("%s: endpoint %s not the model's", name, e))
				}
			}
		}
	}
	for name := range got {
		if !seen[name] {
			problems = append(problems, fmt.Sprintf("%s: not in the model, in the kernel", name))
		}
	}
	sort.Strings(problems)
	if len(problems) > 20 {
		problems = append(problems[:20], fmt.Sprintf("... and %d more", len(problems)-20))
	}
	return strings.Join(problems, "\n")
}

// churnProbe is one request from the client or a pod and what may answer it.
type churnProbe struct {
	from          int // a pod, or -1: the client
	network, addr string
	what          string
	allowed       map[string]bool // pod names; empty: the request must be refused
}

// probes samples up to n ways into live Services (and pod external IPs)
// the client can try, with the endpoints the model allows there.
func (m *churnModel) probes(n int) []churnProbe {
	var all []churnProbe
	names := func(eps []netip.AddrPort) map[string]bool {
		out := map[string]bool{}
		for _, e := range eps {
			for i := range churnPods {
				if e.Addr() == podIP(i) || e.Addr() == podIP6(i) {
					out[nsutil.PodName(i)] = true
				}
			}
		}
		return out
	}
	keys := make([]portal.ServiceKey, 0, len(m.built))
	for k := range m.built {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b portal.ServiceKey) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		if !m.svcs[k].live {
			continue
		}
		for _, p := range m.built[k].Portals {
			network := map[portal.Protocol]string{portal.TCP: "tcp", portal.UDP: "udp"}[p.Key.Protocol]
			if network == "" {
				continue
			}
			hasEps := len(p.ClusterEndpoints) > 0
			internal := p.ClusterEndpoints
			if p.InternalLocal {
				internal = p.LocalEndpoints
			}
			// From the client, outside the cluster: external ways in take
			// the Local policy's endpoints (none: dropped), else all.
			external := p.ClusterEndpoints
			if p.ExternalLocal {
				external = p.LocalEndpoints
			}
			// From a pod, external ways in take all endpoints: the Local
			// policy's chain sends pods on.
			pod := m.rng.IntN(churnPods)
			podAddr := podIP(pod)
			if p.Key.Family == portal.IPv6 {
				podAddr = podIP6(pod)
			}
			add := func(what string, ap netip.AddrPort, eps []netip.AddrPort) {
				m.addProbe(&all, churnProbe{from: -1, network: network, addr: ap.String(), what: fmt.Sprintf("%s %s of %s from the client", what, ap, p.Key)}, eps, hasEps, names)
			}
			addFromPod := func(what string, ap netip.AddrPort, eps []netip.AddrPort) {
				m.addProbe(&all, churnProbe{from: pod, network: network, addr: ap.String(), what: fmt.Sprintf("%s %s of %s from %s", what, ap, p.Key, nsutil.PodName(pod))}, eps, hasEps, names)
			}
			for _, a := range p.ClusterIPs {
				addFromPod(entryClusterIP, netip.AddrPortFrom(a, p.Port), internal)
			}
			for _, a := range p.ExternalIPs {
				addFromPod(entryExternalIP, netip.AddrPortFrom(a, p.Port), p.ClusterEndpoints)
			}
			for _, a := range p.LoadBalancerIPs {
				in := len(p.SourceRanges) == 0
				for _, r := range p.SourceRanges {
					in = in || r.Contains(podAddr)
				}
				if in { // outside the ranges: dropped, with or without endpoints
					addFromPod(entryLoadBalancer, netip.AddrPortFrom(a, p.Port), p.ClusterEndpoints)
				}
			}
			if p.NodePort != 0 && slices.Contains(m.npAddrs, nodeAddr(p.Key.Family)) {
				addFromPod(entryNodePort, netip.AddrPortFrom(nodeAddr(p.Key.Family), p.NodePort), p.ClusterEndpoints)
			}
			for _, a := range p.ClusterIPs {
				add(entryClusterIP, netip.AddrPortFrom(a, p.Port), internal)
			}
			for _, a := range p.ExternalIPs {
				add(entryExternalIP, netip.AddrPortFrom(a, p.Port), external)
			}
			for _, a := range p.LoadBalancerIPs {
				in := len(p.SourceRanges) == 0
				for _, r := range p.SourceRanges {
					in = in || r.Contains(netip.MustParseAddr(clientIP)) || r.Contains(netip.MustParseAddr(clientIP6))
				}
				if in { // outside the ranges: dropped, with or without endpoints
					add(entryLoadBalancer, netip.AddrPortFrom(a, p.Port), external)
				}
			}
			if p.NodePort != 0 && slices.Contains(m.npAddrs, nodeAddr(p.Key.Family)) {
				add(entryNodePort, netip.AddrPortFrom(nodeAddr(p.Key.Family), p.NodePort), external)
			}
		}
	}
	for _, e := range m.podIPs {
		for i := range churnPods {
			if e.Pod == podIP(i) {
				all = append(all, churnProbe{from: -1, network: "tcp", addr: netip.AddrPortFrom(e.External, nsutil.EchoPort).String(),
					what: fmt.Sprintf("pod external IP %v of %v", e.External, e.Pod), allowed: map[string]bool{nsutil.PodName(i): true}})
			}
		}
	}
	m.rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	return all[:min(n, len(all))]
}

func nodeAddr(f portal.Family) netip.Addr {
	if f == portal.IPv6 {
		return netip.MustParseAddr(nodeIP6)
	}
	return netip.MustParseAddr(nodeIP)
}

// addProbe adds pr, allowed to reach eps: none means refused when the
// portal has no endpoints at all (TCP only: a reset answers at once), and
// dropped otherwise, which no request is spent on.
func (m *churnModel) addProbe(all *[]churnProbe, pr churnProbe, eps []netip.AddrPort, hasEps bool, names func([]netip.AddrPort) map[string]bool) {
	switch {
	case len(eps) > 0:
		pr.allowed = names(eps)
	case !hasEps && pr.network == "tcp":
	default:
		return
	}
	*all = append(*all, pr)
}

func (p churnProbe) run(tp *topo) string {
	from := tp.client
	if p.from >= 0 {
		from = tp.pods[p.from]
	}
	r, err := from.Ask(p.network, p.addr, 2*time.Second)
	if len(p.allowed) == 0 {
		if err == nil {
			return fmt.Sprintf("%s: has no endpoints, yet %s answered", p.what, r.Name)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Sprintf("%s: has no endpoints and must be refused at once, got %v", p.what, err)
		}
		return ""
	}
	if err != nil {
		return fmt.Sprintf("%s %s: %v (allowed: %v)", p.network, p.what, err, p.allowed)
	}
	if !p.allowed[r.Name] {
		return fmt.Sprintf("%s %s: answered by %s, allowed: %v", p.network, p.what, r.Name, p.allowed)
	}
	return ""
}
