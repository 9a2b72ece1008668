package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/onehop/onehop/dataplane"
)

// Dump implements dataplane.Dataplane: it reads the IPVS services onehop
// owns and their destinations, with counters, from the kernel, and names
// them from what this process applied and the state file (virtual servers
// it has no name for are listed under their address). Raw is ipvsadm-like
// text plus onehop's iptables chains and source-range ipsets.
func (b *Backend) Dump(ctx context.Context) (*dataplane.Dump, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := b.namesLocked()
	vips, err := b.dummyVIPs()
	if err != nil {
		return nil, err
	}
	servers, _, err := b.listServers(names, vips)
	if err != nil {
		return nil, err
	}
	d := &dataplane.Dump{Backend: b.Name()}
	ports := map[string]*dataplane.DumpPort{}
	live := map[string]int{}
	var raw strings.Builder
	type rawLine struct{ key, text string }
	var lines []rawLine
	for _, ks := range servers {
		s, v := ks.svc, ks.vs
		name, ours := names[v.Key.String()]
		if !ours {
			name = stateEntry{Service: "unknown " + v.Key.String(), Kind: kindClusterIP}
		}
		p := ports[name.Service]
		if p == nil {
			p = &dataplane.DumpPort{Service: name.Service, Topology: name.Topology}
			ports[name.Service] = p
		}
		addr := fmt.Sprintf("%s/%s", netip.AddrPortFrom(v.Key.Addr, v.Key.Port), v.Key.Proto)
		if name.Kind == kindNodePort {
			addr = fmt.Sprintf(":%d/%s", v.Key.Port, v.Key.Proto)
		}
		e := dataplane.DumpEntry{Kind: name.Kind, Addr: addr}
		if !slices.Contains(p.Entries, e) {
			p.Entries = append(p.Entries, e)
		}
		p.Packets += uint64(s.Stats.PacketsIn) + uint64(s.Stats.PacketsOut)
		p.Bytes += s.Stats.BytesIn + s.Stats.BytesOut

		var t strings.Builder
		fmt.Fprintf(&t, "%s %s", v.Key, v.Sched)
		if v.Timeout > 0 {
			fmt.Fprintf(&t, " persistent %d", v.Timeout)
		}
		if v.Fallback {
			t.WriteString(" fallback")
		}
		fmt.Fprintf(&t, "  # %s %s conns=%d packets=%d bytes=%d\n", name.Service, name.Kind,
			s.Stats.Connections, uint64(s.Stats.PacketsIn)+uint64(s.Stats.PacketsOut), s.Stats.BytesIn+s.Stats.BytesOut)
		ds, err := b.ipvs.GetDestinations(s)
		if err != nil {
			return nil, fmt.Errorf("ipvs: destinations of %s: %w", v.Key, err)
		}
		slices.SortFunc(ds, func(x, y *libipvsDest) int { return strings.Compare(destString(x), destString(y)) })
		for _, dst := range ds {
			a := destString(dst)
			fmt.Fprintf(&t, "  -> %s Masq %d active=%d inactive=%d packets=%d bytes=%d\n", a, dst.Weight,
				dst.ActiveConnections, dst.InactiveConnections,
				uint64(dst.Stats.PacketsIn)+uint64(dst.Stats.PacketsOut), dst.Stats.BytesIn+dst.Stats.BytesOut)
			if dst.Weight == 0 {
				continue // draining: not an endpoint any more
			}
			live[name.Service]++
			idx := slices.IndexFunc(p.Endpoints, func(x dataplane.DumpEndpoint) bool { return x.Addr == a })
			if idx < 0 {
				p.Endpoints = append(p.Endpoints, dataplane.DumpEndpoint{Addr: a, Local: slices.Contains(name.Local, a)})
				idx = len(p.Endpoints) - 1
			}
			p.Endpoints[idx].Packets += uint64(dst.Stats.PacketsIn) + uint64(dst.Stats.PacketsOut)
			p.Endpoints[idx].Bytes += dst.Stats.BytesIn + dst.Stats.BytesOut
		}
		lines = append(lines, rawLine{v.Key.String(), t.String()})
	}
	for svc, p := range ports {
		if live[svc] == 0 {
			p.Note = noEndpointsNote
		}
		d.Ports = append(d.Ports, *p)
	}
	d.Sort()
	slices.SortFunc(lines, func(x, y rawLine) int { return strings.Compare(x.key, y.key) })
	for _, l := range lines {
		raw.WriteString(l.text)
	}
	for fam, i := range b.activeIPT() {
		tables, err := i.tablesNow()
		if err != nil {
			return nil, err
		}
		for _, c := range append([]struct{ table, chain string }{{"nat", chainPostrouting}, {"filter", chainFilter}}, entryChains...) {
			fmt.Fprintf(&raw, "\n# %s %s %s\n", fam, c.table, c.chain)
			for _, r := range tables[c.table][c.chain] {
				fmt.Fprintf(&raw, "-A %s %s\n", c.chain, strings.Join(r, " "))
			}
		}
		for _, c := range sortedKeys(tables["filter"]) {
			if strings.HasPrefix(c, srChainPrefix) {
				for _, r := range tables["filter"][c] {
					fmt.Fprintf(&raw, "-A %s %s\n", c, strings.Join(r, " "))
				}
			}
		}
	}
	sets := newPlan()
	if err := b.sets.read(sets); err != nil {
		return nil, err
	}
	for _, name := range sortedKeys(sets.Sets) {
		c := sets.Sets[name]
		fmt.Fprintf(&raw, "\n# %s ipset %s hash:net (%d)\n", c.Family, name, len(c.Nets))
		for _, p := range c.Nets {
			fmt.Fprintf(&raw, "%s\n", p)
		}
	}
	if f := sets.Filter; f.Sets != nil {
		fmt.Fprintf(&raw, "\n# Service IP filter: %d addresses, %d ports (ipsets %v)\n", len(f.VIPs), len(f.Ports), sortedKeys(f.Sets))
	}
	d.Raw = raw.String()
	return d, nil
}

// noEndpointsNote is the nft backend's wording, so dumps read the same.
const noEndpointsNote = "no endpoints: new connections are rejected"
