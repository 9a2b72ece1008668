package dataplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
)

// Tracer is a Dataplane that can tell which way a packet goes through what
// the kernel holds (not through the backend's memory).
type Tracer interface {
	Trace(ctx context.Context, q TraceQuery) (*Trace, error)
}

// TraceQuery is the first packet of a connection to trace.
type TraceQuery struct {
	// From is the client's address; invalid with FromNode, when the node
	// picks its source address as routing does.
	From     netip.Addr
	FromNode bool
	// SourcePort is the client's port; 0: any (conntrack entries of the
	// client to the destination are listed whatever their source port).
	SourcePort uint16
	To         netip.AddrPort
	Protocol   string // tcp, udp or sctp
}

// Trace is where a packet goes through the dataplane, and why.
type Trace struct {
	// Method says how the answer was found: "evaluated from the kernel's
	// ruleset", for example.
	Method   string `json:"method"`
	From     string `json:"from"`
	To       string `json:"to"`
	Protocol string `json:"protocol"`
	// Hook is where the packet enters: prerouting for a packet that
	// arrives, output for one the node sends.
	Hook string `json:"hook"`
	// Match is the way into a Service the packet took, nil when it matched
	// none.
	Match *TraceMatch `json:"match,omitempty"`
	// Steps are the rules the packet meets on every path; Outcomes the
	// paths it can take from there, by weight.
	Steps    []TraceStep    `json:"steps"`
	Outcomes []TraceOutcome `json:"outcomes"`
	// Checks are the policy checks met on the way, in words.
	Checks    []string         `json:"checks,omitempty"`
	Affinity  *TraceAffinity   `json:"affinity,omitempty"`
	Conntrack []TraceConntrack `json:"conntrack,omitempty"`
	APIServer []TraceDisagree  `json:"apiserver,omitempty"`
	Notes     []string         `json:"notes,omitempty"`
}

// TraceMatch is the element of a dispatch map the packet matched.
type TraceMatch struct {
	Service string `json:"service"` // namespace/name:port/proto/family
	Kind    string `json:"kind"`    // cluster-ip, external-ip, load-balancer, node-port
	Set     string `json:"set"`     // the map holding the element
	Element string `json:"element"` // as nft prints it
	Target  string `json:"target"`  // the element's verdict
}

// TraceStep is one rule the packet matched, or a chain it entered or left.
type TraceStep struct {
	Hook  string `json:"hook,omitempty"`
	Chain string `json:"chain"`
	Rule  string `json:"rule,omitempty"` // nft syntax; empty for entering or leaving a chain
	// Handle is the rule's handle in the kernel (nft -a list prints it).
	Handle uint64 `json:"handle,omitempty"`
	Note   string `json:"note,omitempty"`
}

// TraceOutcome is one way the packet can go, with its share of new
// connections (numgen random picks each of N endpoints with weight 1/N).
type TraceOutcome struct {
	Weight  float64 `json:"weight"`
	Verdict string  `json:"verdict"` // accept, drop or reject
	// Reject says how a rejected packet is answered (tcp reset, icmp port
	// unreachable).
	Reject string `json:"reject,omitempty"`
	// Endpoint is the DNAT target, empty when not translated.
	Endpoint   string `json:"endpoint,omitempty"`
	Masquerade bool   `json:"masquerade"`
	// SourceNAT is a source NAT to a fixed address (a pod's own external IP).
	SourceNAT string `json:"snat,omitempty"`
	// Why says why the source is masqueraded or kept.
	Why   string      `json:"why,omitempty"`
	Steps []TraceStep `json:"steps,omitempty"`
}

// TraceAffinity is the ClientIP affinity state of the client.
type TraceAffinity struct {
	Pinned   bool   `json:"pinned"`
	Endpoint string `json:"endpoint,omitempty"`
	Set      string `json:"set,omitempty"`
	Expires  string `json:"expires,omitempty"`
	Note     string `json:"note"`
}

// TraceConntrack is an existing conntrack entry of the client to the
// destination: packets of that connection follow it, not the ruleset.
type TraceConntrack struct {
	Source   string `json:"source"`   // client address:port
	Endpoint string `json:"endpoint"` // where the entry sends it (the reply's source)
	State    string `json:"state,omitempty"`
	// Exact: the entry is for the traced source port itself.
	Exact bool `json:"exact"`
	// Elsewhere: the entry sends it to an endpoint the ruleset would not.
	Elsewhere bool `json:"elsewhere"`
}

// TraceDisagree is a difference between the kernel and the API server.
type TraceDisagree struct {
	Service string `json:"service"`
	Problem string `json:"problem"`
}

// Endpoints returns the DNAT targets of the accepted outcomes and their
// weights.
func (t *Trace) Endpoints() map[string]float64 {
	out := map[string]float64{}
	for _, o := range t.Outcomes {
		if o.Verdict == "accept" && o.Endpoint != "" {
			out[o.Endpoint] += o.Weight
		}
	}
	return out
}

// WriteJSON writes t as indented JSON.
func (t *Trace) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(t)
}

// WriteText writes t for people.
func (t *Trace) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "trace: %s -> %s/%s, a new connection entering at hook %s\n", t.From, t.To, t.Protocol, t.Hook)
	fmt.Fprintf(&b, "method: %s\n", t.Method)
	if t.Match != nil {
		fmt.Fprintf(&b, "matched: %s %s of %s (@%s: %s)\n", t.Match.Kind, t.Match.Element, t.Match.Service, t.Match.Set, t.Match.Target)
	} else {
		b.WriteString("matched: no way into a Service\n")
	}
	b.WriteString("\npath:\n")
	chain := writeSteps(&b, t.Steps, "  ", "")
	b.WriteString("\noutcome:\n")
	for _, o := range t.Outcomes {
		fmt.Fprintf(&b, "  %5.1f%%  %s\n", o.Weight*100, o.summary())
		if o.Why != "" {
			fmt.Fprintf(&b, "          %s\n", o.Why)
		}
		writeSteps(&b, o.Steps, "          ", chain)
	}
	section := func(title string, lines []string) {
		if len(lines) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s:\n", title)
		for _, l := range lines {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	section("checks", t.Checks)
	if a := t.Affinity; a != nil {
		section("affinity", []string{a.Note})
	}
	var ct []string
	for _, c := range t.Conntrack {
		l := fmt.Sprintf("%s -> %s", c.Source, c.Endpoint)
		if c.State != "" {
			l += " (" + c.State + ")"
		}
		switch {
		case c.Exact && c.Elsewhere:
			l += ": this connection exists and goes there, not where the ruleset sends a new one"
		case c.Exact:
			l += ": this connection exists and keeps going there"
		case c.Elsewhere:
			l += ": another connection of this client, to an endpoint the ruleset no longer picks"
		}
		ct = append(ct, l)
	}
	if len(t.Conntrack) == 0 {
		ct = append(ct, "no entry of this client to this destination: the ruleset decides")
	}
	section("conntrack", ct)
	var api []string
	for _, d := range t.APIServer {
		api = append(api, d.Service+": "+d.Problem)
	}
	section("apiserver", api)
	section("notes", t.Notes)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSteps writes steps under a line naming each chain they are in;
// chain is the chain of the step before them. It returns the last chain.
func writeSteps(b *strings.Builder, steps []TraceStep, indent, chain string) string {
	for _, s := range steps {
		if s.Rule == "" {
			if s.Hook != "" {
				fmt.Fprintf(b, "%shook %s: ", indent, s.Hook)
			} else {
				b.WriteString(indent)
			}
			fmt.Fprintf(b, "chain %s", s.Chain)
			if s.Note != "" {
				fmt.Fprintf(b, ": %s", s.Note)
			}
			b.WriteString("\n")
			chain = s.Chain
			continue
		}
		if s.Chain != chain {
			fmt.Fprintf(b, "%schain %s\n", indent, s.Chain)
			chain = s.Chain
		}
		fmt.Fprintf(b, "%s  %s\n", indent, s.Rule)
		if s.Note != "" {
			fmt.Fprintf(b, "%s    => %s\n", indent, s.Note)
		}
	}
	return chain
}

func (o TraceOutcome) summary() string {
	switch o.Verdict {
	case "drop":
		return "dropped"
	case "reject":
		return "rejected (" + o.Reject + ")"
	}
	s := "accepted"
	if o.Endpoint != "" {
		s += ", DNAT to " + o.Endpoint
	} else {
		s += ", not translated"
	}
	switch {
	case o.Masquerade:
		s += ", masqueraded"
	case o.SourceNAT != "":
		s += ", source NAT to " + o.SourceNAT
	default:
		s += ", source kept"
	}
	return s
}
