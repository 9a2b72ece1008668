package difftest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// matrixCell is one probe of the matrix, with the outcome the oracle
// demands of it.
type matrixCell struct {
	Row     behaviour
	Family  v1.IPFamily
	Service *ServiceCase // nil for a row without one
	Way     way
	From    spot
	Probe   probe
	Want    expectation
}

// matrixSpots are the vantage points in vantages()'s order: the outside
// client, pod 1 of each node, each node.
func matrixSpots() []spot {
	out := []spot{{Outside: true}}
	for n := 1; n <= nodes; n++ {
		out = append(out, spot{Pod: true, Node: n})
	}
	for n := 1; n <= nodes; n++ {
		out = append(out, spot{Node: n})
	}
	return out
}

// matrixCells lists every probe of rows in c (family f): each way in that
// applies to the row, over TCP and UDP, from every vantage point that can
// be routed there.
func matrixCells(c *Case, rows []behaviour, f v1.IPFamily) []matrixCell {
	type wayIn struct {
		w way
		t target
	}
	vs, spots := vantages(), matrixSpots()
	var out []matrixCell
	for _, b := range rows {
		applies := func(k wayKind) bool { return b.Ways == nil || slices.Contains(b.Ways, k) }
		var s *ServiceCase
		var ins []wayIn
		if b.NoService {
			for _, p := range []struct {
				proto v1.Protocol
				port  int32
			}{{v1.ProtocolTCP, matrixTCPPort}, {v1.ProtocolUDP, matrixUDPPort}} {
				ins = append(ins, wayIn{way{Kind: wayClusterIP, Proto: p.proto},
					target{Way: "unallocated cluster IP", Proto: proto(p.proto), Addr: hostPort(unallocatedIPOf(f).String(), p.port)}})
			}
		} else {
			s = c.service(matrixServiceName(b.Key, f))
			spec := s.Service.Spec
			name := s.Service.Name
			for _, p := range spec.Ports {
				base := target{Service: name, Port: p.Name, Proto: proto(p.Protocol), Sticky: spec.SessionAffinity == v1.ServiceAffinityClientIP}
				add := func(w way, what, addr string, outside bool) {
					t := base
					t.Way, t.Addr, t.Outside = what, addr, outside
					if w.Undefined {
						t.Port = ""
					}
					ins = append(ins, wayIn{w, t})
				}
				if applies(wayClusterIP) {
					if b.UndefinedPort {
						add(way{Kind: wayClusterIP, Proto: p.Protocol, Undefined: true}, "cluster IP, undefined port", hostPort(spec.ClusterIP, undefinedPort), false)
					} else {
						add(way{Kind: wayClusterIP, Proto: p.Protocol}, "cluster IP", hostPort(spec.ClusterIP, p.Port), false)
					}
				}
				if applies(wayNodePort) {
					for n := 1; n <= nodes; n++ {
						add(way{Kind: wayNodePort, Node: n, Proto: p.Protocol}, "NodePort on "+nodeName(n), hostPort(nodeIPOf(f, n).String(), p.NodePort), true)
					}
				}
				if applies(wayExternalIP) {
					for _, ip := range spec.ExternalIPs {
						add(way{Kind: wayExternalIP, Proto: p.Protocol}, "externalIP", hostPort(ip, p.Port), true)
					}
				}
				if applies(wayLoadBalancer) {
					for _, ip := range s.Ingress {
						add(way{Kind: wayLoadBalancer, Proto: p.Protocol}, "load-balancer IP", hostPort(ip, p.Port), true)
					}
				}
			}
		}
		for _, in := range ins {
			for i, sp := range spots {
				if sp.Outside && !in.t.Outside {
					continue
				}
				out = append(out, matrixCell{Row: b, Family: f, Service: s, Way: in.w, From: sp,
					Probe: probe{From: vs[i], To: in.t}, Want: expect(b.seen(s), in.w, sp, f)})
			}
		}
	}
	return out
}

// observeAll sends every cell's probe on tw, parallelProbes at a time (a
// client's probes of a Service with affinity one after another), and
// returns their outcomes in order.
func (tw *Twin) observeAll(ctx context.Context, cells []matrixCell) []outcome {
	out := make([]outcome, len(cells))
	groups, byKey := [][]int{}, map[string]int{}
	for i, c := range cells {
		key := fmt.Sprint(i)
		if c.Probe.To.Sticky {
			key = c.Probe.From.Name + "/" + c.Probe.To.Service
		}
		g, ok := byKey[key]
		if !ok {
			g, byKey[key] = len(groups), len(groups)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	inParallel(len(groups), func(g int) {
		for _, i := range groups[g] {
			out[i] = tw.observe(ctx, cells[i])
		}
	})
	return out
}

// observe sends c's probe until its outcome is what the oracle demands (and
// it sent at least enough requests to tell), or until it cannot be. An
// outcome the oracle does not expect is checked again with a longer
// timeout per request: the answers of both rounds count, the failures of
// the second only (a short timeout can be the machine's load).
func (tw *Twin) observe(ctx context.Context, c matrixCell) outcome {
	got := tw.sample(ctx, c, timeout)
	if c.Want.matches(got) || ctx.Err() != nil {
		return got
	}
	return merge(got, tw.sample(ctx, c, recheckTimeout))
}

// giveUpSilent is how many failures in a row, with no answer, end a probe
// that expects answers: one whose answers come half the time with
// timeouts between stops early once in 2^giveUpSilent.
const giveUpSilent = 6

// refusalWait is the least a request waits where the oracle expects a
// refusal: kube-proxy's ICMPv6 port unreachable reaches a TCP client here
// only when the SYN is sent again, after a second.
const refusalWait = 1500 * time.Millisecond

func (tw *Twin) sample(ctx context.Context, c matrixCell, each time.Duration) outcome {
	least, most := c.Want.tries()
	if slices.Contains(c.Want.Failures, "refused") {
		each = max(each, refusalWait)
	}
	seen := map[string]bool{}
	answered := false
	var got outcome
	for i := 1; i <= most; i++ {
		for _, l := range tw.send(ctx, c.Probe, 1, each, 0) {
			seen[l] = true
			answered = answered || strings.Contains(l, " saw ")
		}
		got = got[:0]
		for l := range seen {
			got = append(got, l)
		}
		slices.Sort(got)
		switch {
		case ctx.Err() != nil:
			return got
		case i >= least && (c.Want.matches(got) || c.Want.unexpected(got)):
			return got
		case !answered && len(c.Want.Answers) > 0 && i >= giveUpSilent:
			return got
		}
	}
	return got
}

// cellStatus is how a cell fared, from best to worst.
type cellStatus int

const (
	cellOK      cellStatus = iota
	cellKnown              // onehop differs, on a list with the reason
	cellDiffers            // onehop differs from kube-proxy and the oracle
	cellOracle             // kube-proxy differs from the oracle: the oracle is suspect
)

func (s cellStatus) String() string {
	return [...]string{"ok", "known", "differs", "kube-proxy ≠ oracle"}[s]
}

// cellResult is a cell's outcome on each twin (kube-proxy, onehop) and its
// status.
type cellResult struct {
	Cell   matrixCell
	Got    [2]outcome
	Status cellStatus
	Known  *allowance
}

func (r cellResult) String() string {
	c := r.Cell
	return fmt.Sprintf("%s / %s / %s / %s: %s\n    oracle:     %s\n    kube-proxy: %s\n    onehop:     %s",
		c.Row.Name, c.Way.Kind, c.Family, c.Probe.To.Proto, c.Probe, c.Want, r.Got[0], r.Got[1])
}

// judge compares each cell's outcomes with the oracle: a cell is ok when
// both twins give what the oracle demands.
func judge(c *Case, cells []matrixCell, got [2][]outcome) []cellResult {
	out := make([]cellResult, len(cells))
	for i, cell := range cells {
		r := cellResult{Cell: cell, Got: [2]outcome{got[0][i], got[1][i]}}
		kp, oh := cell.Want.matches(r.Got[0]), cell.Want.matches(r.Got[1])
		switch {
		case !kp:
			r.Status = cellOracle
		case !oh:
			r.Status = cellDiffers
			d := difference{Probe: cell.Probe, Outcomes: r.Got}
			if r.Known = allowed(c, d); r.Known == nil {
				r.Known = matrixKnown(cell, r.Got[1])
			}
			if r.Known != nil {
				r.Status = cellKnown
			}
		}
		out[i] = r
	}
	return out
}

// matrixKnownDifferences are cells where onehop gives another outcome
// than kube-proxy and the oracle, found by the matrix and not (yet) on the
// differential tester's lists (allowed.go); match sees the cell and
// onehop's outcome.
var matrixKnownDifferences = []struct {
	allowance
	match func(c matrixCell, onehop outcome) bool
}{}

func matrixKnown(c matrixCell, onehop outcome) *allowance {
	for i := range matrixKnownDifferences {
		if matrixKnownDifferences[i].match(c, onehop) {
			return &matrixKnownDifferences[i].allowance
		}
	}
	return nil
}

// matrixTable prints results as a Markdown table: a row per behaviour and
// protocol, a column per way in and family, each cell the worst status of
// its probes ("—" where the way does not apply).
func matrixTable(results []cellResult, families []v1.IPFamily) string {
	type col struct {
		w wayKind
		f v1.IPFamily
	}
	var cols []col
	for _, f := range families {
		for _, w := range []wayKind{wayClusterIP, wayNodePort, wayExternalIP, wayLoadBalancer} {
			cols = append(cols, col{w, f})
		}
	}
	type rowKey struct {
		name  string
		proto v1.Protocol
	}
	worst := map[rowKey]map[col]cellStatus{}
	for _, r := range results {
		k := rowKey{r.Cell.Row.Name, r.Cell.Way.Proto}
		if worst[k] == nil {
			worst[k] = map[col]cellStatus{}
		}
		c := col{r.Cell.Way.Kind, r.Cell.Family}
		if s, ok := worst[k][c]; !ok || r.Status > s {
			worst[k][c] = r.Status
		}
	}
	var b strings.Builder
	b.WriteString("| behaviour | protocol |")
	for _, c := range cols {
		fmt.Fprintf(&b, " %s %s |", c.w, c.f)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, beh := range behaviours() {
		for _, p := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
			k := rowKey{beh.Name, p}
			if worst[k] == nil {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s |", beh.Name, p)
			for _, c := range cols {
				s, ok := worst[k][c]
				if !ok {
					b.WriteString(" — |")
					continue
				}
				fmt.Fprintf(&b, " %s |", s)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
