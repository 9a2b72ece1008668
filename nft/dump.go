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
	conn, err := newConn(b.netnsFD)
	if err != nil {
		return nil, err
	}
	k, err := readKernel(conn, b.table)
	if err != nil {
		return nil, err
	}
	return k.dump(), nil
}

// kernelTable is the onehop table as read from the kernel.
type kernelTable struct {
	chains []string
	rules  map[string][]*nftables.Rule
	// anonymous set elements referenced by rules, by set name
	anon map[string][]nftables.SetElement
	// named set elements, by set name
	elems map[string][]nftables.SetElement
}

func readKernel(conn *nftables.Conn, t *nftables.Table) (*kernelTable, error) {
	if _, err := conn.ListTableOfFamily(t.Name, t.Family); err != nil {
		return nil, fmt.Errorf("table inet %s not found (is onehop running here?): %w", t.Name, err)
	}
	chains, err := conn.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	k := &kernelTable{rules: map[string][]*nftables.Rule{}, anon: map[string][]nftables.SetElement{}, elems: map[string][]nftables.SetElement{}}
	for _, c := range chains {
		if c.Table.Name != t.Name {
			continue
		}
		k.chains = append(k.chains, c.Name)
		rules, err := conn.GetRules(t, c)
		if err != nil {
			return nil, fmt.Errorf("rules of %s: %w", c.Name, err)
		}
		k.rules[c.Name] = rules
		for _, r := range rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok && strings.HasPrefix(l.SetName, "__") {
					els, err := conn.GetSetElements(&nftables.Set{Table: t, Name: l.SetName, ID: l.SetID, Anonymous: true})
					if err != nil {
						return nil, fmt.Errorf("set %s of %s: %w", l.SetName, c.Name, err)
					}
					k.anon[l.SetName] = els
				}
			}
		}
	}
	sort.Strings(k.chains)
	for _, s := range fixedSets(t) {
		els, err := conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		sort.Slice(els, func(i, j int) bool { return string(els[i].Key) < string(els[j].Key) })
		k.elems[s.Name] = els
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
		kind, pk, ok := parsePortalChain(name)
		if !ok {
			continue
		}
		p := port(pk)
		for _, r := range k.rules[name] {
			pkts, bytes := ruleCounter(r)
			if kind == kindService || (kind == kindExternal && p.Packets == 0) {
				p.Packets, p.Bytes = p.Packets+pkts, p.Bytes+bytes
			}
			if kind == kindService || kind == kindAll {
				for _, ep := range k.ruleEndpoints(pk.Family, r) {
					p.Endpoints = appendEndpoint(p.Endpoints, ep.String())
				}
			}
		}
	}
	for _, f := range families {
		for _, set := range []string{setVIPs(f), setNoEndpoints(f)} {
			for _, el := range k.elems[set] {
				ip, proto, prt, ok := decodeVIPKey(f, el.Key)
				if !ok {
					continue
				}
				entry, pk, ok := elemPortal(el)
				if !ok {
					continue
				}
				p := port(pk)
				p.Entries = append(p.Entries, dataplane.DumpEntry{Kind: entry, Addr: fmt.Sprintf("%s/%s", netip.AddrPortFrom(ip, prt), proto)})
				if set == setNoEndpoints(f) {
					p.Note = "no endpoints: new connections are rejected"
				}
			}
		}
		for _, set := range []string{setNodePorts(f), setNoEndpointsNP(f)} {
			for _, el := range k.elems[set] {
				proto, prt, ok := decodeProtoPortKey(el.Key)
				if !ok {
					continue
				}
				entry, pk, ok := elemPortal(el)
				if !ok {
					continue
				}
				p := port(pk)
				p.Entries = append(p.Entries, dataplane.DumpEntry{Kind: entry, Addr: fmt.Sprintf(":%d/%s", prt, proto)})
				if set == setNoEndpointsNP(f) {
					p.Note = "no endpoints: new connections are rejected"
				}
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

// ruleEndpoints returns the DNAT targets of a rule.
func (k *kernelTable) ruleEndpoints(f portal.Family, r *nftables.Rule) []netip.AddrPort {
	var imm [][]byte
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Immediate:
			imm = append(imm, e.Data)
		case *expr.Lookup:
			if !strings.HasPrefix(e.SetName, "endpoints") || len(imm) != 1 {
				continue
			}
			var out []netip.AddrPort
			for _, el := range k.elems[e.SetName] {
				if len(el.Key) < 4 || string(el.Key[:4]) != string(imm[0]) {
					continue
				}
				if ap, ok := decodeAddrPortVal(f, el.Val); ok {
					out = append(out, ap)
				}
			}
			return out
		}
	}
	if len(imm) == 2 {
		a, ok := netip.AddrFromSlice(imm[0])
		if ok && len(imm[1]) == 2 {
			return []netip.AddrPort{netip.AddrPortFrom(a, uint16(imm[1][0])<<8|uint16(imm[1][1]))}
		}
	}
	return nil
}
