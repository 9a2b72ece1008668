package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
)

// This file evaluates the rules of the onehop table, as read back from the
// kernel, for the first packet of one connection, as the kernel's
// nft_do_chain would: registers of 4-byte slots, loads from a packet built
// for the 5-tuple, compares, set and map lookups (interval sets included),
// verdict maps, jump, goto and return, NAT. Where numgen picks a number,
// every number is followed, each path weighing 1/modulus. A jhash (the
// pick of a Maglev chain) is computed as the kernel computes it, from the
// packet's 5-tuple: its source port included, so the trace says that
// another source port may go elsewhere. An expression it
// cannot evaluate stops the trace with an error naming it: the answer is
// exact or there is none.

// evalEnv is what every path evaluates against.
type evalEnv struct {
	k *kernelTable
	// local reports whether an address is one of the node's (fib ... type local).
	local func(netip.Addr) bool
}

// pathRun is one path through the ruleset: numgen takes the numbers in
// choices (0 past their end) and the moduli it met are kept in mods.
type pathRun struct {
	env     *evalEnv
	pkt     tracePacket
	regs    [64]byte
	choices []int
	mods    []int
	err     error

	hook  string
	steps []dataplane.TraceStep
	hits  []lookupHit // of the rule under evaluation

	verdict, reject string
	dnat            netip.AddrPort
	dnatDone        bool
	masq            bool
	snat            netip.Addr
	markWhy, why    string
	entry           *lookupHit
	affinity        *dataplane.TraceAffinity
	checks          []string
}

// lookupHit is an element a rule found.
type lookupHit struct {
	set  string
	decl *setDecl
	el   nftables.SetElement
}

// ruleResult is how a rule ends: with no verdict (the next rule follows),
// not matching (break), or with a verdict.
type ruleResult struct {
	kind  expr.VerdictKind
	chain string
}

var (
	ruleNext  = ruleResult{kind: expr.VerdictContinue}
	ruleBreak = ruleResult{kind: expr.VerdictBreak}
)

func (r *pathRun) fail(format string, args ...any) ruleResult {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
	return ruleResult{kind: expr.VerdictDrop}
}

// reg returns the n bytes of the registers from reg on.
func (r *pathRun) reg(reg uint32, n int) []byte {
	s := slot(reg)
	if s < 0 || s*4+n > len(r.regs) {
		r.fail("register %d out of range", reg)
		return make([]byte, n)
	}
	return r.regs[s*4 : s*4+n]
}

// store writes v into the registers from reg on, zero-padding the last slot
// as the kernel does.
func (r *pathRun) store(reg uint32, v []byte) {
	s := slot(reg)
	n := slotsOf(len(v)) * 4
	if s < 0 || s*4+n > len(r.regs) {
		r.fail("register %d out of range", reg)
		return
	}
	clear(r.regs[s*4 : s*4+n])
	copy(r.regs[s*4:], v)
}

func (r *pathRun) step(chain, rule, note string) {
	r.steps = append(r.steps, dataplane.TraceStep{Chain: chain, Rule: rule, Note: note})
}

// hookChains returns the base chains of the table on hook, by priority.
func (e *evalEnv) hookChains(hook nftables.ChainHook) []*nftables.Chain {
	var out []*nftables.Chain
	for _, c := range e.k.chainList {
		if c.Hooknum != nil && *c.Hooknum == hook {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b *nftables.Chain) int { return prio(a) - prio(b) })
	return out
}

func prio(c *nftables.Chain) int {
	if c.Priority == nil {
		return 0
	}
	return int(*c.Priority)
}

// runHook runs the base chains of hook in priority order; it returns false
// when the packet is dropped.
func (r *pathRun) runHook(hook nftables.ChainHook) bool {
	for _, c := range r.env.hookChains(hook) {
		r.steps = append(r.steps, dataplane.TraceStep{Hook: hookName(hook), Chain: c.Name,
			Note: fmt.Sprintf("type %s, priority %s", c.Type, priorityText(prio(c), hook))})
		if !r.runBase(c) || r.err != nil {
			return false
		}
	}
	return true
}

// runBase runs one base chain: its verdict is accept (the next base chain
// or hook follows) or drop.
func (r *pathRun) runBase(base *nftables.Chain) bool {
	type frame struct {
		chain string
		next  int
	}
	var stack []frame
	cur, i := base.Name, 0
	for steps := 0; ; steps++ {
		if steps > 10000 {
			r.fail("more than 10000 rules on one path: a loop?")
			return false
		}
		rules := r.env.k.rules[cur]
		if i >= len(rules) {
			if len(stack) == 0 {
				if base.Policy != nil && *base.Policy == nftables.ChainPolicyDrop {
					r.step(cur, "", "end of the base chain: policy drop")
					r.verdict = "drop"
					return false
				}
				return true
			}
			r.leave(cur)
			r.step(cur, "", "end of chain: return to "+stack[len(stack)-1].chain)
			cur, i = stack[len(stack)-1].chain, stack[len(stack)-1].next
			stack = stack[:len(stack)-1]
			continue
		}
		rule := rules[i]
		i++
		res := r.rule(cur, rule)
		if r.err != nil {
			return false
		}
		switch res.kind {
		case expr.VerdictContinue, expr.VerdictBreak:
			continue
		case expr.VerdictJump, expr.VerdictGoto:
			if _, ok := r.env.k.rules[res.chain]; !ok {
				r.fail("chain %s: %s to chain %s, which is not in the table", cur, verdictText(&expr.Verdict{Kind: res.kind}), res.chain)
				return false
			}
			if res.kind == expr.VerdictJump {
				stack = append(stack, frame{cur, i})
			}
			cur, i = res.chain, 0
			r.enter(cur)
		case expr.VerdictReturn:
			if len(stack) == 0 {
				return true
			}
			cur, i = stack[len(stack)-1].chain, stack[len(stack)-1].next
			stack = stack[:len(stack)-1]
		case expr.VerdictAccept:
			return true
		case expr.VerdictDrop:
			if r.verdict == "" {
				r.verdict = "drop"
			}
			return false
		default:
			r.fail("chain %s: verdict %s is not evaluated", cur, verdictText(&expr.Verdict{Kind: res.kind}))
			return false
		}
	}
}

// rule evaluates one rule. A rule that matched is recorded as a step.
func (r *pathRun) rule(chain string, rule *nftables.Rule) ruleResult {
	r.hits = r.hits[:0]
	res := ruleNext
	var notes []string
	for _, e := range rule.Exprs {
		var note string
		res, note = r.expr(chain, e)
		if note != "" {
			notes = append(notes, note)
		}
		if r.err != nil {
			r.err = fmt.Errorf("chain %s, rule %q: %w", chain, r.env.k.ruleText(rule), r.err)
			return res
		}
		if res.kind != expr.VerdictContinue {
			break
		}
	}
	if res.kind == expr.VerdictBreak {
		return res
	}
	r.noteRule(chain, rule, res, notes)
	return res
}

// noteRule records a matched rule and what it means for the trace.
func (r *pathRun) noteRule(chain string, rule *nftables.Rule, res ruleResult, notes []string) {
	text := r.env.k.ruleText(rule)
	r.meaning(chain, text, rule, res)
	for _, h := range r.hits {
		if r.entry == nil && isDispatchSet(h.set) {
			if _, _, ok := elemPortal(h.el); ok {
				hit := h
				r.entry = &hit
			}
		}
	}
	r.steps = append(r.steps, dataplane.TraceStep{Chain: chain, Rule: text, Handle: rule.Handle, Note: strings.Join(notes, "; ")})
}

// isDispatchSet: the maps whose elements are the ways into Services.
func isDispatchSet(name string) bool {
	for _, f := range families {
		switch name {
		case setVIPs(f), setNodePorts(f), setNoEndpoints(f), setNoEndpointsNP(f), setFlatGate(f), setFlatGateNP(f):
			return true
		}
	}
	return false
}

// expr evaluates one expression; the note says what it found, for the step.
func (r *pathRun) expr(chain string, e expr.Any) (ruleResult, string) {
	p := &r.pkt
	switch e := e.(type) {
	case *expr.Counter:
	case *expr.Immediate:
		r.store(e.Register, e.Data)
	case *expr.Verdict:
		return ruleResult{kind: e.Kind, chain: e.Chain}, ""
	case *expr.Meta:
		return r.meta(e), ""
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad {
			return r.fail("payload writes are not evaluated"), ""
		}
		var hdr []byte
		switch e.Base {
		case expr.PayloadBaseNetworkHeader:
			hdr = p.nh
		case expr.PayloadBaseTransportHeader:
			hdr = p.th
		default:
			return r.fail("link-layer payload is not evaluated"), ""
		}
		if int(e.Offset+e.Len) > len(hdr) {
			return ruleBreak, ""
		}
		r.store(e.DestRegister, hdr[e.Offset:e.Offset+e.Len])
	case *expr.Ct:
		if e.SourceRegister {
			return r.fail("ct set is not evaluated"), ""
		}
		switch e.Key {
		case expr.CtKeySTATE:
			r.store(e.Register, binaryutil.NativeEndian.PutUint32(p.ctState))
		case expr.CtKeySTATUS:
			r.store(e.Register, binaryutil.NativeEndian.PutUint32(p.ctStatus))
		case expr.CtKeyMARK:
			r.store(e.Register, make([]byte, 4))
		default:
			return r.fail("ct key %d is not evaluated", e.Key), ""
		}
	case *expr.Fib:
		if !e.ResultADDRTYPE || e.FlagSADDR == e.FlagDADDR || e.FlagIIF || e.FlagOIF {
			return r.fail("this fib lookup is not evaluated"), ""
		}
		t := uint32(unix.RTN_UNICAST)
		if r.env.local(p.addr(e.FlagDADDR)) {
			t = unix.RTN_LOCAL
		}
		r.store(e.Register, binaryutil.NativeEndian.PutUint32(t))
	case *expr.Numgen:
		if e.Modulus == 0 {
			return r.fail("numgen mod 0"), ""
		}
		if e.Modulus == 1 { // a constant: a chain's id (loadChainID)
			r.store(e.Register, binaryutil.NativeEndian.PutUint32(e.Offset))
			return ruleNext, ""
		}
		n := 0
		if len(r.mods) < len(r.choices) {
			n = r.choices[len(r.mods)]
		}
		r.mods = append(r.mods, int(e.Modulus))
		r.store(e.Register, binaryutil.NativeEndian.PutUint32(uint32(n)+e.Offset))
		return ruleNext, fmt.Sprintf("numgen picked %d of %d", n, e.Modulus)
	case *expr.Hash:
		return r.hash(e)
	case *expr.Bitwise:
		src := r.reg(e.SourceRegister, int(e.Len))
		if len(e.Mask) != int(e.Len) || len(e.Xor) != int(e.Len) {
			return r.fail("bitwise of %d bytes with a mask of %d", e.Len, len(e.Mask)), ""
		}
		out := make([]byte, e.Len)
		for i := range out {
			out[i] = src[i]&e.Mask[i] ^ e.Xor[i]
		}
		r.store(e.DestRegister, out)
	case *expr.Cmp:
		c := bytes.Compare(r.reg(e.Register, len(e.Data)), e.Data)
		ok := map[expr.CmpOp]bool{expr.CmpOpEq: c == 0, expr.CmpOpNeq: c != 0, expr.CmpOpLt: c < 0,
			expr.CmpOpLte: c <= 0, expr.CmpOpGt: c > 0, expr.CmpOpGte: c >= 0}[e.Op]
		if !ok {
			return ruleBreak, ""
		}
	case *expr.Lookup:
		return r.lookup(chain, e)
	case *expr.NAT:
		return r.nat(e)
	case *expr.Masq:
		r.masq = true
		r.verdict = "accept"
		return ruleResult{kind: expr.VerdictAccept}, ""
	case *expr.Reject:
		r.verdict, r.reject = "reject", strings.TrimPrefix(strings.TrimPrefix(rejectText(e), "reject with "), "reject")
		if r.reject == "" {
			r.reject = "icmp port unreachable"
		}
		return ruleResult{kind: expr.VerdictDrop}, ""
	case *expr.Dynset:
		s := r.env.k.set(e.SetName)
		if s == nil {
			return r.fail("dynset on %s, which is not in the table", e.SetName), ""
		}
		op := map[uint32]string{unix.NFT_DYNSET_OP_ADD: "adds", unix.NFT_DYNSET_OP_UPDATE: "adds or refreshes"}[e.Operation]
		return ruleNext, fmt.Sprintf("%s %s in @%s", op, s.keyText(r.reg(e.SrcRegKey, int(s.keyLen))), e.SetName)
	default:
		return r.fail("expression %T is not evaluated", e), ""
	}
	return ruleNext, ""
}

func (r *pathRun) meta(e *expr.Meta) ruleResult {
	p := &r.pkt
	if e.SourceRegister {
		if e.Key != expr.MetaKeyMARK {
			return r.fail("meta key %d set is not evaluated", e.Key)
		}
		p.mark = binaryutil.NativeEndian.Uint32(r.reg(e.Register, 4))
		return ruleNext
	}
	switch e.Key {
	case expr.MetaKeyNFPROTO:
		r.store(e.Register, []byte{nfproto(p.family)})
	case expr.MetaKeyL4PROTO:
		r.store(e.Register, []byte{p.l4proto})
	case expr.MetaKeyMARK:
		r.store(e.Register, binaryutil.NativeEndian.PutUint32(p.mark))
	default:
		return r.fail("meta key %d is not evaluated", e.Key)
	}
	return ruleNext
}

func (r *pathRun) lookup(chain string, e *expr.Lookup) (ruleResult, string) {
	s := r.env.k.set(e.SetName)
	if s == nil {
		return r.fail("lookup in %s, which is not in the table", e.SetName), ""
	}
	key := r.reg(e.SourceRegister, int(s.keyLen))
	el, found := findElem(s, r.env.k.elems[e.SetName], key)
	isAff := strings.HasPrefix(e.SetName, affinitySetPrefix) && !s.isMap()
	if isAff {
		r.noteAffinity(chain, e.SetName, el, found)
	}
	if !e.IsDestRegSet {
		if found == e.Invert {
			return ruleBreak, ""
		}
		note := ""
		if found {
			r.hits = append(r.hits, lookupHit{e.SetName, s, el})
			note = fmt.Sprintf("%s is in %s", s.keyText(key), r.setLabel(e.SetName, s))
		} else {
			note = fmt.Sprintf("%s is not in %s", s.keyText(key), r.setLabel(e.SetName, s))
		}
		return ruleNext, note
	}
	if !found {
		return ruleBreak, ""
	}
	r.hits = append(r.hits, lookupHit{e.SetName, s, el})
	note := fmt.Sprintf("%s: %s", r.setLabel(e.SetName, s), elemText(s, el))
	if e.DestRegister == 0 {
		v := el.VerdictData
		if v == nil {
			v = decodeVerdict(el.Val)
		}
		if v == nil {
			return r.fail("undecodable verdict in %s", e.SetName), ""
		}
		return ruleResult{kind: v.Kind, chain: v.Chain}, note
	}
	r.store(e.DestRegister, el.Val)
	return ruleNext, note
}

// setLabel names a set in a note: @name, or the rule's own anonymous set.
func (r *pathRun) setLabel(name string, s *setDecl) string {
	if s.anonymous() {
		return "the rule's " + map[bool]string{true: "map", false: "set"}[s.isMap()]
	}
	return "@" + name
}

// findElem looks key up as the kernel does: an exact match, or for an
// interval set the interval that holds it (the greatest element not above
// the key, which must be an interval start).
func findElem(s *setDecl, els []nftables.SetElement, key []byte) (nftables.SetElement, bool) {
	if s.flags&unix.NFT_SET_INTERVAL == 0 {
		for _, el := range els {
			if bytes.Equal(el.Key, key) {
				return el, true
			}
		}
		return nftables.SetElement{}, false
	}
	var best *nftables.SetElement
	for i := range els {
		el := &els[i]
		c := bytes.Compare(el.Key, key)
		if c > 0 {
			continue
		}
		if best == nil {
			best = el
			continue
		}
		switch bc := bytes.Compare(el.Key, best.Key); {
		case bc > 0, bc == 0 && !el.IntervalEnd:
			best = el
		}
	}
	if best == nil || best.IntervalEnd {
		return nftables.SetElement{}, false
	}
	return *best, true
}

func (r *pathRun) nat(e *expr.NAT) (ruleResult, string) {
	p := &r.pkt
	n := 4
	if e.Family == unix.NFPROTO_IPV6 {
		n = 16
	}
	if e.RegAddrMin == 0 {
		return r.fail("NAT without an address is not evaluated"), ""
	}
	a, _ := netip.AddrFromSlice(r.reg(e.RegAddrMin, n))
	var port uint16
	if e.RegProtoMin != 0 {
		port = binary.BigEndian.Uint16(r.reg(e.RegProtoMin, 2))
	}
	r.verdict = "accept"
	switch e.Type {
	case expr.NATTypeDestNAT:
		if port == 0 {
			port = p.dport()
		}
		p.setAddr(true, a)
		binary.BigEndian.PutUint16(p.th[2:], port)
		p.ctStatus |= ctStatusDstNAT
		r.dnat, r.dnatDone = netip.AddrPortFrom(a, port), true
		return ruleResult{kind: expr.VerdictAccept}, "destination is now " + r.dnat.String()
	case expr.NATTypeSourceNAT:
		p.ctStatus |= ctStatusSrcNAT
		r.snat = a
		return ruleResult{kind: expr.VerdictAccept}, "source is now " + a.String()
	}
	return r.fail("NAT type %d is not evaluated", e.Type), ""
}

// hash evaluates a jhash as the kernel does (kernelJhash); a symhash is
// not evaluated.
func (r *pathRun) hash(e *expr.Hash) (ruleResult, string) {
	if e.Type != expr.HashTypeJenkins || e.Modulus == 0 {
		return r.fail("hash of type %d mod %d is not evaluated", e.Type, e.Modulus), ""
	}
	if e.Seed == 0 {
		return r.fail("jhash without a seed: the kernel drew one at random, which it does not show"), ""
	}
	in := r.reg(e.SourceRegister, int(e.Length))
	v := kernelJhash(in, e.Seed, e.Modulus, e.Offset)
	r.store(e.DestRegister, binaryutil.NativeEndian.PutUint32(v))
	r.check("Maglev: the endpoint is picked by a hash of the connection's addresses, ports and protocol, the same on every node; from source port %d it is slot %d of %d, and another source port may reach another endpoint",
		binary.BigEndian.Uint16(r.pkt.th[0:]), v-e.Offset, e.Modulus)
	return ruleNext, fmt.Sprintf("jhash picked slot %d of %d", v-e.Offset, e.Modulus)
}
