package nft

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/dataplane"
)

// maxTracePaths bounds the paths a trace follows (the product of the numgen
// moduli met on one way).
const maxTracePaths = 4096

// runPath follows the packet through the hooks it meets: the nat and filter
// chains where it enters, then, unless it is for this node, postrouting. The
// node's own packet to one of its addresses (not translated elsewhere) comes
// back in through loopback: hook input follows postrouting.
func (e *evalEnv) runPath(pkt tracePacket, fromNode bool, choices []int) *pathRun {
	r := &pathRun{env: e, pkt: pkt.clone(), choices: choices}
	if fromNode {
		r.hook = "output"
		if r.runHook(*nftables.ChainHookOutput) && r.runHook(*nftables.ChainHookPostrouting) && e.local(r.pkt.addr(true)) {
			r.runHook(*nftables.ChainHookInput)
		}
		return r
	}
	r.hook = "prerouting"
	if !r.runHook(*nftables.ChainHookPrerouting) {
		return r
	}
	if e.local(r.pkt.addr(true)) {
		r.runHook(*nftables.ChainHookInput)
		return r
	}
	if r.runHook(*nftables.ChainHookForward) {
		r.runHook(*nftables.ChainHookPostrouting)
	}
	return r
}

// paths follows every path of the packet: each number each numgen can pick.
func (e *evalEnv) paths(pkt tracePacket, fromNode bool) ([]*pathRun, error) {
	var runs []*pathRun
	queue := [][]int{nil}
	for len(queue) > 0 {
		if len(runs) >= maxTracePaths {
			return nil, fmt.Errorf("more than %d paths: not evaluated", maxTracePaths)
		}
		c := queue[0]
		queue = queue[1:]
		r := e.runPath(pkt, fromNode, c)
		if r.err != nil {
			return nil, r.err
		}
		runs = append(runs, r)
		for i := len(c); i < len(r.mods); i++ {
			for v := 1; v < r.mods[i]; v++ {
				nc := make([]int, i+1)
				copy(nc, c)
				nc[i] = v
				queue = append(queue, nc)
			}
		}
	}
	return runs, nil
}

func (r *pathRun) weight() float64 {
	w := 1.0
	for _, m := range r.mods {
		w /= float64(m)
	}
	return w
}

// enter records what entering a chain says about the Service's policies.
func (r *pathRun) enter(chain string) {
	kind, pk, ok := parsePortalChain(chain)
	switch {
	case ok && kind == kindAll:
		r.check("internalTrafficPolicy: Local: traffic from outside the cluster reaches all endpoints (chain %s)", chain)
	case ok && kind == kindService:
		if _, local := r.env.k.rules[portalChain(kindAll, pk)]; local {
			r.check("internalTrafficPolicy: Local: chain %s holds this node's endpoints only", chain)
		}
	case ok && kind == kindExternal:
		r.check("externalTrafficPolicy: Local (chain %s)", chain)
	}
}

// leave records a chain that ended without a verdict.
func (r *pathRun) leave(chain string) {
	if isFirewallChain(chain) {
		r.check("loadBalancerSourceRanges: %s is within the ranges of chain %s: allowed", r.pkt.addr(false), chain)
	}
}

func isFirewallChain(name string) bool {
	return strings.HasPrefix(name, kindFirewall) && strings.Count(name, "/") == 2
}

func (r *pathRun) check(format string, args ...any) {
	c := fmt.Sprintf(format, args...)
	if !slices.Contains(r.checks, c) {
		r.checks = append(r.checks, c)
	}
}

// meaning records what a matched rule means: a masquerade mark and why, a
// policy check, the masquerade itself.
func (r *pathRun) meaning(chain, text string, rule *nftables.Rule, res ruleResult) {
	has := func(set func(string) bool) bool {
		return slices.ContainsFunc(r.hits, func(h lookupHit) bool { return set(h.set) })
	}
	prefixed := func(p string) func(string) bool { return func(s string) bool { return strings.HasPrefix(s, p) } }
	setsMark := slices.ContainsFunc(rule.Exprs, func(e expr.Any) bool {
		m, ok := e.(*expr.Meta)
		return ok && m.SourceRegister && m.Key == expr.MetaKeyMARK
	})
	ext := strings.HasPrefix(chain, kindExternal) && !strings.Contains(chain, "@")
	switch {
	case setsMark && chain != chainNatPostrouting:
		switch {
		case has(prefixed("cluster-ips")) && strings.Contains(text, "saddr !="):
			r.markWhy = "a cluster IP reached from outside the cluster CIDRs"
		case has(prefixed("cluster-ips")):
			r.markWhy = "masquerade-all: every connection to a cluster IP"
		case has(prefixed("ext-marks")):
			r.markWhy = "an external or load-balancer IP of a Service with externalTrafficPolicy: Cluster"
		case has(prefixed("np-marks")):
			r.markWhy = "a node port of a Service with externalTrafficPolicy: Cluster"
		case ext:
			r.markWhy = "the node's own connection under externalTrafficPolicy: Local reaches all endpoints, masqueraded"
			r.check("externalTrafficPolicy: Local, but the client is this node: all endpoints")
		default:
			r.markWhy = "rule sets the masquerade mark"
		}
	case ext && res.kind == expr.VerdictGoto && shortCircuit(res.chain):
		r.check("externalTrafficPolicy: Local, but the client is inside the cluster CIDRs: all endpoints, source kept")
	case ext && res.kind == expr.VerdictDrop:
		r.check("externalTrafficPolicy: Local and no endpoint on this node: dropped")
	case ext:
		r.check("externalTrafficPolicy: Local: this node's endpoints only, the client's source kept")
	case isFirewallChain(chain) && res.kind == expr.VerdictDrop:
		r.check("loadBalancerSourceRanges: %s is outside the ranges of chain %s: dropped", r.pkt.addr(false), chain)
	case (chain == chainNoEndpoints || chain == chainNoEndpointsNP) && res.chain == chainReject && has(isDispatchSet):
		r.check("no endpoints: new connections are rejected")
	case (chain == chainNoEndpoints || chain == chainNoEndpointsNP) && res.chain == chainDrop:
		r.check("endpoints on other nodes only, under a Local traffic policy: new connections are dropped")
	case chain == chainNoEndpoints && res.chain == chainReject:
		r.check("a port the cluster IP does not define: rejected")
	case chain == chainNoEndpoints && res.kind == expr.VerdictDrop:
		r.check("an address of the Service CIDR no Service holds: dropped")
	}
	if r.masq && r.why == "" {
		if has(prefixed("hairpin")) {
			r.why = "hairpin: the pod reached itself through the Service; masqueraded so that it answers through the node"
		} else {
			r.why = "masquerade mark: " + r.markWhy
		}
	}
}

// shortCircuit: the chain is a svc or all chain, where an ext chain sends
// pods and the node.
func shortCircuit(chain string) bool {
	kind, _, ok := parsePortalChain(chain)
	return ok && (kind == kindService || kind == kindAll)
}

// noteAffinity records what an affinity set says about the client.
func (r *pathRun) noteAffinity(chain, set string, el nftables.SetElement, found bool) {
	_, ep, _ := strings.Cut(set, "@")
	switch {
	case found:
		left := nftDuration(el.Expires.Round(time.Second))
		r.affinity = &dataplane.TraceAffinity{Pinned: true, Endpoint: ep, Set: set, Expires: left,
			Note: fmt.Sprintf("ClientIP affinity (chain %s): this client is pinned to %s by @%s, for %s more", chain, ep, set, left)}
	case r.affinity == nil:
		r.affinity = &dataplane.TraceAffinity{
			Note: fmt.Sprintf("ClientIP affinity (chain %s): this client is not pinned; a new connection picks an endpoint at random and pins the client to it", chain)}
	}
}

// report turns the paths into a Trace.
func report(runs []*pathRun) *dataplane.Trace {
	t := &dataplane.Trace{Hook: runs[0].hook}
	common := len(runs[0].steps)
	for _, r := range runs[1:] {
		n := 0
		for n < common && n < len(r.steps) && r.steps[n] == runs[0].steps[n] {
			n++
		}
		common = n
	}
	t.Steps = slices.Clone(runs[0].steps[:common])
	type key struct {
		verdict, reject, endpoint, snat, why string
		masq                                 bool
	}
	idx := map[key]int{}
	for _, r := range runs {
		o := r.outcome()
		k := key{o.Verdict, o.Reject, o.Endpoint, o.SourceNAT, o.Why, o.Masquerade}
		if i, ok := idx[k]; ok {
			t.Outcomes[i].Weight += o.Weight
		} else {
			idx[k] = len(t.Outcomes)
			o.Steps = slices.Clone(r.steps[common:])
			t.Outcomes = append(t.Outcomes, o)
		}
		for _, c := range r.checks {
			if !slices.Contains(t.Checks, c) {
				t.Checks = append(t.Checks, c)
			}
		}
		if t.Affinity == nil && r.affinity != nil {
			t.Affinity = r.affinity
		}
		if t.Match == nil && r.entry != nil {
			t.Match = entryMatch(*r.entry)
		}
	}
	slices.SortStableFunc(t.Outcomes, func(a, b dataplane.TraceOutcome) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return t
}

func entryMatch(h lookupHit) *dataplane.TraceMatch {
	kind, pk, _ := elemPortal(h.el)
	v := h.el.VerdictData
	if v == nil {
		v = decodeVerdict(h.el.Val)
	}
	target := ""
	switch {
	case isFlatGate(h.set):
		target = "goto " + chainFlat(pk.Family) // a plain set: the gate rule's verdict
		if strings.Contains(h.set, "nodeports") {
			target = "goto " + chainFlatNP(pk.Family)
		}
	case v != nil:
		target = verdictText(v)
	}
	return &dataplane.TraceMatch{Service: pk.String(), Kind: kind, Set: h.set,
		Element: h.decl.keyText(h.el.Key), Target: target}
}

func (r *pathRun) outcome() dataplane.TraceOutcome {
	o := dataplane.TraceOutcome{Weight: r.weight(), Verdict: r.verdict, Reject: r.reject, Masquerade: r.masq}
	if o.Verdict == "" {
		o.Verdict = "accept"
	}
	if r.dnatDone {
		o.Endpoint = r.dnat.String()
	}
	if r.snat.IsValid() {
		o.SourceNAT = r.snat.String()
	}
	switch {
	case o.Verdict != "accept":
	case r.masq:
		o.Why = r.why
	case o.SourceNAT != "":
		o.Why = "the pod's own external IP (@pod-snat)"
	default:
		o.Why = "source kept: no masquerade mark, and not a hairpin"
	}
	return o
}

// entryOf finds the way into a Service the packet's destination is, when
// no path reached its dispatch element (source ranges dropped it first).
func (e *evalEnv) entryOf(pkt tracePacket) *dataplane.TraceMatch {
	f := pkt.family
	vip := vipKeyOf(pkt)
	np := append(pad4([]byte{pkt.l4proto}), pad4(slices.Clone(pkt.th[2:4]))...)
	npIP := false
	if s := e.k.set(setNodePortIPs(f)); s != nil {
		_, npIP = findElem(s, e.k.elems[s.name], addrBytes(pkt.addr(true)))
	}
	for _, c := range []struct {
		set string
		key []byte
		ok  bool
	}{{setVIPs(f), vip, true}, {setNoEndpoints(f), vip, true}, {setFlatGate(f), vip, true},
		{setNodePorts(f), np, npIP}, {setNoEndpointsNP(f), np, npIP}, {setFlatGateNP(f), np, npIP}} {
		s := e.k.set(c.set)
		if !c.ok || s == nil {
			continue
		}
		if el, ok := findElem(s, e.k.elems[c.set], c.key); ok {
			if _, _, ok := elemPortal(el); ok {
				return entryMatch(lookupHit{c.set, s, el})
			}
		}
	}
	return nil
}

// vipKeyOf is the packet's ip daddr . meta l4proto . th dport.
func vipKeyOf(pkt tracePacket) []byte {
	b := addrBytes(pkt.addr(true))
	b = pad4(append(b, pkt.l4proto))
	return pad4(append(b, pkt.th[2:4]...))
}
