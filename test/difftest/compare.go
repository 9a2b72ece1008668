package difftest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
)

// runner gives both twins the same cases and compares what the probes see.
type runner struct {
	twins [2]*Twin // kube-proxy, onehop
	log   *slog.Logger
	// modeAllowed are allowances of the proxies' mode beyond allowed.go's
	// (ipvsmode.go's for IPVS), marked on each step's differences.
	modeAllowed []allowance
}

// difference is one probe whose outcome is not the same on both twins.
type difference struct {
	Probe    probe
	Outcomes [2]outcome // in the order of runner.twins
	Allowed  *allowance
}

func (r *runner) describe(d difference) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n", d.Probe)
	for i, tw := range r.twins {
		fmt.Fprintf(&b, "    %-10s %s\n", tw.Name+":", d.Outcomes[i])
	}
	if d.Allowed != nil {
		fmt.Fprintf(&b, "    allowed (%s): %s\n", d.Allowed.Name, d.Allowed.Reason)
	}
	return b.String()
}

// both runs fn on each twin at once and returns the first error.
func (r *runner) both(fn func(i int, tw *Twin) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(r.twins))
	for i, tw := range r.twins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i, tw)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// run writes c to both twins, waits until every proxy has it, probes,
// rechecks every probe whose outcomes differ, removes c, and returns the
// differences that remain (allowed ones marked).
func (r *runner) run(ctx context.Context, c *Case) ([]difference, error) {
	diffs, _, err := r.runSteps(ctx, c, nil)
	return diffs, err
}

// runSteps runs c, then each of its changes in turn (each step writes the
// change to both twins, waits for both, and compares again), stopping at
// the first step that differs, and removes every object it wrote. The
// differences are those of the last step compared, the number of changes
// made before it is at.
func (r *runner) runSteps(ctx context.Context, c *Case, steps []step) (diffs []difference, at int, err error) {
	written := []*Case{c}
	defer func() {
		// Every state written: a failed step may have left some of each.
		for i := len(written) - 1; i >= 0; i-- {
			if err := r.both(func(_ int, tw *Twin) error { return tw.remove(context.WithoutCancel(ctx), written[i]) }); err != nil {
				r.log.Warn("remove case", "seed", c.Seed, "err", err)
			}
		}
		// Both proxies see the case gone before the next is written: a
		// Service of the same name written at once could be taken for an
		// update of the old one and keep its state, such as the clients
		// its ClientIP affinity remembers.
		if err := r.both(func(_ int, tw *Twin) error { return tw.sync(context.WithoutCancel(ctx)) }); err != nil {
			r.log.Warn("sync after removing case", "seed", c.Seed, "err", err)
		}
	}()
	diffs, err = r.step(ctx, nil, c, "", nil)
	for i, st := range steps {
		if err != nil || len(failing(diffs)) > 0 {
			break
		}
		prev := written[len(written)-1]
		written = append(written, st.Next)
		at = i + 1
		diffs, err = r.step(ctx, prev, st.Next, st.What, flowProbes(prev))
	}
	return diffs, at, err
}

// step writes c to both twins (created, or changed from prev), waits for
// both and compares their probes, and the flows of fps opened before the
// change.
func (r *runner) step(ctx context.Context, prev, c *Case, what string, fps []probe) ([]difference, error) {
	began := time.Now()
	var flows [2]openFlows
	_ = r.both(func(i int, tw *Twin) error {
		flows[i] = tw.open(ctx, fps)
		return nil
	})
	defer func() {
		for _, f := range flows {
			f.close()
		}
	}()
	err := r.both(func(_ int, tw *Twin) error {
		var err error
		if prev == nil {
			err = tw.apply(ctx, c)
		} else {
			err = tw.update(ctx, prev, c)
		}
		if err != nil {
			return err
		}
		return tw.sync(ctx)
	})
	if err != nil {
		return nil, err
	}
	synced := time.Now()
	// Flows are asked once onehop's conntrack cleanup of the change is
	// done (cleanupPacing): before, a UDP flow could still reach the pod
	// the change took out.
	if udpFlowsOpen(fps, flows) {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(synced.Add(cleanupPacing))):
		}
	}
	var flowsSeen [2]map[string]map[string]string
	_ = r.both(func(i int, tw *Twin) error {
		flowsSeen[i] = tw.after(ctx, flows[i])
		return nil
	})
	var gone []*ServiceCase
	if prev != nil {
		for _, s := range prev.Services {
			if c.service(s.Service.Name) == nil {
				gone = append(gone, s)
			}
		}
	}
	ps := c.probesWith(gone)
	var out [2][]outcome
	_ = r.both(func(i int, tw *Twin) error {
		out[i] = tw.sendAll(ctx, ps, tries, timeout, giveUp)
		return nil
	})
	var again []probe
	diffs := compareFlows(c, fps, flowsSeen)
	for i, p := range ps {
		a, b := normalize(c, p, out[0][i]), normalize(c, p, out[1][i])
		if a.equal(b) {
			continue
		}
		// A difference already on a list needs no second look.
		d := difference{Probe: p, Outcomes: [2]outcome{a, b}}
		if d.Allowed = allowed(c, d); d.Allowed != nil {
			diffs = append(diffs, d)
			continue
		}
		again = append(again, p)
	}
	rechecked := len(again)
	// Rechecks: what answered in any round could answer (an answer is never
	// noise); failures count from the last round only (a first pass's
	// short timeout can be the machine's load).
	first := map[string][2]outcome{}
	for i, p := range ps {
		first[p.String()] = [2]outcome{out[0][i], out[1][i]}
	}
	for round := 0; round < recheckRounds && len(again) > 0; round++ {
		_ = r.both(func(i int, tw *Twin) error {
			out[i] = tw.sendAll(ctx, again, recheckTries, recheckTimeout, 0)
			return nil
		})
		var still []probe
		for i, p := range again {
			seen := first[p.String()]
			for t := range seen {
				seen[t] = merge(seen[t], out[t][i])
			}
			first[p.String()] = seen
			a, b := normalize(c, p, seen[0]), normalize(c, p, seen[1])
			switch {
			case a.equal(b):
			case p.To.Sticky && len(a) == 1 && len(b) == 1:
				// Each twin stuck to one pod, or to one failure: where
				// the path works for some pods only (a pod's traffic to
				// another node's NodePort, not masqueraded, to a pod
				// beside it), which one each twin drew decides.
				r.log.Debug("inconclusive under affinity", "seed", c.Seed, "probe", p.String(), "a", a.String(), "b", b.String())
			case round+1 < recheckRounds:
				still = append(still, p)
			default:
				d := difference{Probe: p, Outcomes: [2]outcome{a, b}}
				d.Allowed = allowed(c, d)
				diffs = append(diffs, d)
			}
		}
		again = still
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, tw := range r.twins {
		if msg := tw.exited(); msg != "" {
			return nil, fmt.Errorf("%s", msg)
		}
	}
	r.markModeAllowed(c, diffs)
	nflows := 0
	for _, byPod := range flowsSeen[1] {
		nflows += len(byPod)
	}
	r.log.Info("case compared", "seed", c.Seed, "change", what, "services", len(c.Services), "probes", len(ps), "flows", nflows, "rechecked", rechecked,
		"differences", len(diffs), "sync", synced.Sub(began).Round(time.Millisecond), "took", time.Since(began).Round(time.Millisecond))
	return diffs, nil
}

// cleanupPacing bounds how long after a sync onehop deletes the conntrack
// entries the sync made stale: its cleaner walks the table at once, or a
// second after its last walk (dataplane.ConntrackCleaner), plus the walk.
// kube-proxy walks it at every sync, which its default minSyncPeriod (1 s)
// paces alike; the twins run it with 0 s (docs/difftest.md).
const cleanupPacing = 1300 * time.Millisecond

// udpFlowsOpen says whether a UDP flow of some probe of ps is open on
// either twin.
func udpFlowsOpen(ps []probe, flows [2]openFlows) bool {
	return slices.ContainsFunc(ps, func(p probe) bool {
		return p.To.Proto == "udp" && (len(flows[0][p.String()]) > 0 || len(flows[1][p.String()]) > 0)
	})
}

// normalize makes outcomes of a Service with ClientIP affinity
// comparable: each twin may stick to a different pod, so one pod (any)
// is what counts.
func normalize(c *Case, p probe, o outcome) outcome {
	s := c.service(p.To.Service)
	if s == nil || s.Service.Spec.SessionAffinity != v1.ServiceAffinityClientIP {
		return o
	}
	var answers, rest outcome
	for _, l := range o {
		if strings.Contains(l, " saw ") {
			answers = append(answers, l)
		} else {
			rest = append(rest, l)
		}
	}
	if len(answers) != 1 {
		return o
	}
	return append(outcome{"one pod (ClientIP affinity)"}, rest...)
}

// failing returns the differences no allowance covers.
func failing(diffs []difference) []difference {
	var out []difference
	for _, d := range diffs {
		if d.Allowed == nil {
			out = append(out, d)
		}
	}
	return out
}

// merge keeps the answers of both outcomes and the failures of the later.
func merge(earlier, later outcome) outcome {
	set := map[string]bool{}
	for _, l := range earlier {
		if strings.Contains(l, " saw ") {
			set[l] = true
		}
	}
	for _, l := range later {
		set[l] = true
	}
	out := make(outcome, 0, len(set))
	for l := range set {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}
