package difftest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// Flows open across a change: before a change, every probe that can
// carry one opens up to flowDials flows (a TCP connection, or a UDP socket
// with its source port fixed), keeping one per pod that answered. After
// the change each flow asks once more: did it keep its pod, move, or
// fail? Which pods a twin's flows landed on is chance, so a flow is
// compared only with the other twin's flow on the same pod.
const (
	flowDials   = 4
	flowTimeout = time.Second
)

// flow is one open connection and the pod that first answered on it.
type flow struct {
	conn net.Conn
	r    *bufio.Reader
	pod  string
	n    int
}

func (f *flow) ask(ctx context.Context, wait time.Duration) (nsutil.Reply, error) {
	f.n++
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_ = f.conn.SetDeadline(deadline)
	line := fmt.Sprintf("flow %d", f.n)
	if _, err := f.conn.Write([]byte(line + "\n")); err != nil {
		return nsutil.Reply{}, err
	}
	b, err := f.r.ReadBytes('\n')
	if err != nil {
		return nsutil.Reply{}, err
	}
	var rep nsutil.Reply
	if err := json.Unmarshal(b, &rep); err != nil {
		return rep, err
	}
	if rep.Echo != line {
		return rep, fmt.Errorf("reply echoes %q, sent %q", rep.Echo, line)
	}
	return rep, nil
}

// openFlows is one twin's open flows: probe -> pod -> flow.
type openFlows map[string]map[string]*flow

func (o openFlows) close() {
	for _, byPod := range o {
		for _, f := range byPod {
			_ = f.conn.Close()
		}
	}
}

// flowProbes are the probes that can carry a flow: the ways into c's
// Services, not an undefined port.
func flowProbes(c *Case) []probe {
	var out []probe
	for _, p := range c.probes() {
		if p.To.Port != "" {
			out = append(out, p)
		}
	}
	return out
}

// open opens tw's flows for ps, parallelProbes probes at a time.
func (tw *Twin) open(ctx context.Context, ps []probe) openFlows {
	found := make([]map[string]*flow, len(ps))
	inParallel(len(ps), func(k int) {
		p := ps[k]
		byPod := map[string]*flow{}
		for i := range flowDials {
			dctx, cancel := context.WithTimeout(ctx, timeout)
			c, err := nsutil.Dialer(p.From.netns(tw))(dctx, p.To.Proto, p.To.Addr)
			cancel()
			if err != nil {
				if i == 0 {
					break // a way in that does not answer carries no flow
				}
				continue
			}
			f := &flow{conn: c, r: bufio.NewReader(c)}
			rep, err := f.ask(ctx, timeout)
			if err != nil || byPod[rep.Name] != nil {
				_ = c.Close()
				if err != nil && i == 0 {
					break
				}
				continue
			}
			f.pod = rep.Name
			byPod[rep.Name] = f
		}
		found[k] = byPod
	})
	out := openFlows{}
	for k, p := range ps {
		out[p.String()] = found[k]
	}
	return out
}

// after asks every flow once more and returns what each saw, by probe and
// pod: "kept its pod", "moved to another pod", or how it failed.
func (tw *Twin) after(ctx context.Context, o openFlows) map[string]map[string]string {
	type open struct {
		key, pod string
		f        *flow
	}
	var all []open
	for key, byPod := range o {
		for pod, f := range byPod {
			all = append(all, open{key, pod, f})
		}
	}
	got := make([]string, len(all))
	inParallel(len(all), func(i int) {
		rep, err := all[i].f.ask(ctx, flowTimeout)
		switch {
		case err != nil:
			got[i] = classify(err)
		case rep.Name == all[i].pod:
			got[i] = "kept its pod"
		default:
			got[i] = "moved to another pod"
		}
	})
	out := map[string]map[string]string{}
	for i, o := range all {
		if out[o.key] == nil {
			out[o.key] = map[string]string{}
		}
		out[o.key][o.pod] = got[i]
	}
	return out
}

// compareFlows returns a difference for every pod that carried a flow of
// the same probe in both twins and whose flow fared differently.
func compareFlows(c *Case, ps []probe, seen [2]map[string]map[string]string) []difference {
	var out []difference
	for _, p := range ps {
		a, b := seen[0][p.String()], seen[1][p.String()]
		var pods []string
		for pod := range a {
			if _, ok := b[pod]; ok {
				pods = append(pods, pod)
			}
		}
		sort.Strings(pods)
		for _, pod := range pods {
			if a[pod] == b[pod] {
				continue
			}
			fp := p
			fp.To.Way = p.To.Way + ", flow open on " + pod + " across the change"
			fp.To.Flow = pod
			d := difference{Probe: fp, Outcomes: [2]outcome{{a[pod]}, {b[pod]}}}
			d.Allowed = allowed(c, d)
			out = append(out, d)
		}
	}
	return out
}
