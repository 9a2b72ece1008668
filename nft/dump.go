package nft

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// Dump implements dataplane.Dataplane: it reads the onehop table back from
// the kernel and describes it per Service port.
func (b *Backend) Dump(ctx context.Context) (*dataplane.Dump, error) {
	k, err := readKernel(b.netnsFD, b.table)
	if err != nil {
		return nil, err
	}
	return k.dump(), nil
}

// kernelTable is the onehop table as read from the kernel.
type kernelTable struct {
	// chains holds the chain names, sorted; chainList the chains in the
	// kernel's order (the order `nft list` prints them in).
	chains    []string
	chainList []*nftables.Chain
	rules     map[string][]*nftables.Rule
	// sets are the declarations of the named and anonymous sets, in the
	// kernel's order.
	sets []*setDecl
	// elems are the elements of every set, named or anonymous, by set
	// name, sorted by key.
	elems map[string][]nftables.SetElement
}

// set returns the declaration of the named set, nil when there is none.
func (k *kernelTable) set(name string) *setDecl {
	for _, s := range k.sets {
		if s.name == name {
			return s
		}
	}
	return nil
}

// readKernel reads the whole table from the kernel of the network namespace
// netnsFD (-1: the caller's), over one socket.
func readKernel(netnsFD int, t *nftables.Table) (*kernelTable, error) {
	conn, err := newConn(netnsFD, nftables.AsLasting())
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.CloseLasting() }()
	if _, err := conn.ListTableOfFamily(t.Name, t.Family); err != nil {
		return nil, fmt.Errorf("table inet %s not found (is onehop running here?): %w", t.Name, err)
	}
	chains, err := conn.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	k := &kernelTable{rules: map[string][]*nftables.Rule{}, elems: map[string][]nftables.SetElement{}}
	for _, c := range chains {
		if c.Table.Name != t.Name {
			continue
		}
		k.chains = append(k.chains, c.Name)
		k.chainList = append(k.chainList, c)
		rules, err := conn.GetRules(t, c)
		if err != nil {
			return nil, fmt.Errorf("rules of %s: %w", c.Name, err)
		}
		k.rules[c.Name] = rules
	}
	sort.Strings(k.chains)
	if k.sets, err = listSets(netnsFD, t); err != nil {
		return nil, err
	}
	for _, s := range k.sets {
		els, err := readElems(func() ([]nftables.SetElement, error) {
			return conn.GetSetElements(&nftables.Set{Table: t, Name: s.name, ID: s.id, Anonymous: s.anonymous()})
		})
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.name, err)
		}
		k.elems[s.name] = s.sortElems(els)
	}
	return k, nil
}

func (k *kernelTable) dump() *dataplane.Dump {
	d := &dataplane.Dump{Backend: "nft"}
	ports := map[portal.PortKey]*dataplane.DumpPort{}
	port := func(pk portal.PortKey) *dataplane.DumpPort {
		p, ok := ports[pk]
		if !ok {
			p = &dataplane.DumpPort{Service: pk.String()}
			ports[pk] = p
		}
		return p
	}
	for _, name := range k.chains {
		// An affinity chain is named for its portal chain @ its endpoint.
		portalName, _, _ := strings.Cut(name, "@")
		kind, pk, ok := parsePortalChain(portalName)
		if !ok {
			continue
		}
		p := port(pk)
		if rules := k.rules[name]; (kind == kindService || kind == kindAll) && len(rules) > 0 {
			if text := tagTopology(rules[0].UserData); text != "" {
				p.Topology = text
			}
		}
		for _, r := range k.rules[name] {
			if size, ok := maglevSlots(r); ok {
				p.Balancing = fmt.Sprintf("maglev (%d slots)", size)
			}
			pkts, bytes := ruleCounter(r)
			if kind == kindService || kind == kindAffinityEndpoint || (kind == kindExternal && p.Packets == 0) {
				p.Packets, p.Bytes = p.Packets+pkts, p.Bytes+bytes
			}
			if kind == kindService || kind == kindAll || kind == kindAffinityEndpoint {
				for _, ep := range k.ruleEndpoints(pk.Family, r) {
					p.Endpoints = appendEndpoint(p.Endpoints, ep.String())
				}
			}
		}
	}
	for _, f := range families {
		// The ways in by address (@vips, @noep) and by node port
		// (@nodeports, @noep-nodeports); the second set of each pair
		// holds the ways in without endpoints.
		// A flat way in is in a gate set, its endpoints in the flat maps.
		for _, way := range []struct {
			sets [3]string
			addr func(key []byte) (string, bool)
		}{
			{[3]string{setVIPs(f), setNoEndpoints(f), setFlatGate(f)}, func(key []byte) (string, bool) {
				ip, proto, prt, ok := decodeVIPKey(f, key)
				return fmt.Sprintf("%s/%s", netip.AddrPortFrom(ip, prt), proto), ok
			}},
			{[3]string{setNodePorts(f), setNoEndpointsNP(f), setFlatGateNP(f)}, func(key []byte) (string, bool) {
				proto, prt, ok := decodeProtoPortKey(key)
				return fmt.Sprintf(":%d/%s", prt, proto), ok
			}},
		} {
			for i, set := range way.sets {
				for _, el := range k.elems[set] {
					addr, ok := way.addr(el.Key)
					if !ok {
						continue
					}
					entry, pk, ok := elemPortal(el)
					if !ok {
						continue
					}
					p := port(pk)
					p.Entries = append(p.Entries, dataplane.DumpEntry{Kind: entry, Addr: addr})
					if i == 1 {
						p.Note = noEndpointsNote(el)
					}
				}
			}
		}
	}
	for _, s := range k.sets {
		if !isFlatMap(s.name) {
			continue
		}
		for _, el := range k.elems[s.name] {
			_, pk, ok := elemPortal(el)
			if !ok {
				continue
			}
			if ap, ok := decodeAddrPortVal(pk.Family, el.Val); ok {
				p := port(pk)
				p.Endpoints = appendEndpoint(p.Endpoints, ap.String())
				p.Note = flatNote
			}
		}
	}
	for _, p := range ports {
		d.Ports = append(d.Ports, *p)
	}
	d.Sort()
	d.Raw = k.render()
	return d
}

// flatNote is the note of a Service port whose ways in are flat (flat.go).
const flatNote = "flat: balanced by map elements, no packet counters"

// noEndpointsNote says what happens to new connections to a way in listed
// in a no-endpoints map.
func noEndpointsNote(el nftables.SetElement) string {
	v := verdictAttrText(el.Val)
	if el.VerdictData != nil {
		v = verdictText(el.VerdictData)
	}
	if v == "goto "+chainDrop {
		return "endpoints on other nodes only (Local policy): new connections are dropped"
	}
	return "no endpoints: new connections are rejected"
}

func appendEndpoint(eps []dataplane.DumpEndpoint, addr string) []dataplane.DumpEndpoint {
	for _, e := range eps {
		if e.Addr == addr {
			return eps
		}
	}
	return append(eps, dataplane.DumpEndpoint{Addr: addr})
}

// elemPortal reads the entry kind and portal of an element from its comment.
func elemPortal(el nftables.SetElement) (string, portal.PortKey, bool) {
	entry, chain, ok := strings.Cut(el.Comment, " ")
	if !ok {
		return "", portal.PortKey{}, false
	}
	_, pk, ok := parsePortalChain(chain)
	return entry, pk, ok
}

func ruleCounter(r *nftables.Rule) (uint64, uint64) {
	for _, e := range r.Exprs {
		if c, ok := e.(*expr.Counter); ok {
			return c.Packets, c.Bytes
		}
	}
	return 0, 0
}

// ruleEndpointElems returns the endpoint map a rule picks from and the
// elements it can pick (those keyed by the chain id the rule loads:
// loadChainID), or "" when the rule picks from no endpoint map. imm holds
// the rule's immediates.
func (k *kernelTable) ruleEndpointElems(r *nftables.Rule) (set string, els []nftables.SetElement, imm [][]byte) {
	var id []byte
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Immediate:
			imm = append(imm, e.Data)
		case *expr.Numgen:
			if e.Modulus == 1 && e.Register == reg1 {
				id = numgenKey(e.Offset)
			}
		case *expr.Lookup:
			if !strings.HasPrefix(e.SetName, "endpoints") || id == nil {
				continue
			}
			for _, el := range k.elems[e.SetName] {
				if len(el.Key) >= 4 && string(el.Key[:4]) == string(id) {
					els = append(els, el)
				}
			}
			return e.SetName, els, imm
		}
	}
	return "", nil, imm
}

// ruleEndpoints returns the DNAT targets of a rule.
func (k *kernelTable) ruleEndpoints(f portal.Family, r *nftables.Rule) []netip.AddrPort {
	set, els, imm := k.ruleEndpointElems(r)
	if set != "" {
		var out []netip.AddrPort
		for _, el := range els {
			if ap, ok := decodeAddrPortVal(f, el.Val); ok {
				out = append(out, ap)
			}
		}
		return out
	}
	if len(imm) == 2 {
		a, ok := netip.AddrFromSlice(imm[0])
		if ok && len(imm[1]) == 2 {
			return []netip.AddrPort{netip.AddrPortFrom(a, uint16(imm[1][0])<<8|uint16(imm[1][1]))}
		}
	}
	return nil
}
