package dataplane

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Dump is the kernel's view of the ruleset, in a shape common to backends.
type Dump struct {
	Backend string     `json:"backend"`
	Ports   []DumpPort `json:"ports"`
	// Raw is the backend's native rendering (nft syntax, ipvsadm-like), for -o nft.
	Raw string `json:"-"`
}

// DumpPort is one Service port in one family as the kernel holds it.
type DumpPort struct {
	Service   string         `json:"service"` // namespace/name:port/proto/family
	Entries   []DumpEntry    `json:"entries"`
	Endpoints []DumpEndpoint `json:"endpoints"`
	Packets   uint64         `json:"packets"`
	Bytes     uint64         `json:"bytes"`
	Note      string         `json:"note,omitempty"` // e.g. "no endpoints: reject"
	// Balancing is how a new connection's endpoint is picked when it is
	// not at random: "maglev (1021 slots)".
	Balancing string `json:"balancing,omitempty"`
	// Topology says which endpoints topology hints left to the Cluster
	// policy, and why: "node hints for <node>", "zone hints for <zone>",
	// "none: <why>" (portal.Portal.Topology).
	Topology string `json:"topology,omitempty"`
}

// DumpEntry is one way into a Service port.
type DumpEntry struct {
	Kind string `json:"kind"` // cluster-ip, node-port, external-ip, load-balancer
	Addr string `json:"addr"` // ip:port/proto or :port/proto for node ports
}

// DumpEndpoint is one endpoint, with counters where the backend keeps them.
type DumpEndpoint struct {
	Addr    string `json:"addr"`
	Local   bool   `json:"local,omitempty"`
	Packets uint64 `json:"packets,omitempty"`
	Bytes   uint64 `json:"bytes,omitempty"`
}

// Sort orders ports and their contents for stable output.
func (d *Dump) Sort() {
	sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Service < d.Ports[j].Service })
	for _, p := range d.Ports {
		sort.Slice(p.Entries, func(i, j int) bool {
			if p.Entries[i].Kind != p.Entries[j].Kind {
				return p.Entries[i].Kind < p.Entries[j].Kind
			}
			return p.Entries[i].Addr < p.Entries[j].Addr
		})
		sort.Slice(p.Endpoints, func(i, j int) bool { return p.Endpoints[i].Addr < p.Endpoints[j].Addr })
	}
}

// WriteJSON writes d as indented JSON.
func (d *Dump) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(d)
}

// WriteTable writes d for people: one block per Service port.
func (d *Dump) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "backend: %s, %d service ports\n", d.Backend, len(d.Ports))
	for _, p := range d.Ports {
		fmt.Fprintf(tw, "\n%s\tpackets=%d bytes=%d\n", p.Service, p.Packets, p.Bytes)
		for _, e := range p.Entries {
			fmt.Fprintf(tw, "  %s\t%s\n", e.Kind, e.Addr)
		}
		if p.Note != "" {
			fmt.Fprintf(tw, "  note\t%s\n", p.Note)
		}
		if p.Balancing != "" {
			fmt.Fprintf(tw, "  balancing\t%s\n", p.Balancing)
		}
		if p.Topology != "" {
			fmt.Fprintf(tw, "  topology\t%s\n", p.Topology)
		}
		for _, ep := range p.Endpoints {
			extra := []string{}
			if ep.Local {
				extra = append(extra, "local")
			}
			if ep.Packets > 0 || ep.Bytes > 0 {
				extra = append(extra, fmt.Sprintf("packets=%d bytes=%d", ep.Packets, ep.Bytes))
			}
			fmt.Fprintf(tw, "  -> %s\t%s\n", ep.Addr, strings.Join(extra, " "))
		}
	}
	return tw.Flush()
}
