package watchscale

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/test/cluster"
)

// perChange is what the agents received for one kind of change, summed over
// them and averaged over the changes made.
type perChange struct {
	events float64
	bytes  float64
}

// result is one run's measurement.
type result struct {
	mode   string
	agents int
	shape  shape
	// watches is the number of watches each agent holds open.
	watches float64
	// syncBytes is what all agents received until their first listing
	// was complete (lists and the watches' first events).
	syncBytes int64
	changes   map[string]perChange
	// controller is what the controller received per change (split only).
	controller map[string]perChange
}

// modes are the two ways the hook runs: split (`agent controller` does the
// cluster-wide part, as deploy/ ships it) and every agent a candidate.
var modes = map[string]bool{"split": true, "all": false}

// hookConfig is the cloud hook of the simulated agents: pod external IPs on,
// no provider that needs the kernel.
func hookConfig(split bool) config.Config {
	return config.Config{PodExternalIPs: true, ExternalIPCIDRs: []string{podIPCIDR}, SeparateController: split, LeaseNamespace: "kube-system"}
}

// run starts a control plane, populates it with s, starts one agent per
// node (and, split, one controller) and makes each change k times.
func run(ctx context.Context, log *slog.Logger, mode string, s shape, k int) (*result, error) {
	cp, err := cluster.Start(ctx, cluster.Options{Log: log})
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	admin, err := cp.Client()
	if err != nil {
		return nil, err
	}
	if err := populate(ctx, admin, s); err != nil {
		return nil, fmt.Errorf("populate: %w", err)
	}
	actx, cancel := context.WithCancel(ctx)
	var all []*agent
	defer func() {
		cancel()
		for _, a := range all {
			<-a.done
		}
	}()
	cfg := hookConfig(modes[mode])
	var ctl []*agent
	if modes[mode] {
		c, err := startController(actx, cp.RESTConfig(), cfg)
		if err != nil {
			return nil, err
		}
		ctl = []*agent{c}
		all = append(all, c)
	}
	var agents []*agent
	began := time.Now()
	for i := range s.nodes {
		a, err := startAgent(actx, cp.RESTConfig(), nodeName(i), cfg, true)
		if err != nil {
			return nil, err
		}
		agents = append(agents, a)
		all = append(all, a)
	}
	if err := waitSynced(ctx, all); err != nil {
		return nil, err
	}
	settle(ctx, all, time.Second, time.Minute)
	log.Info("agents synced", "mode", mode, "agents", len(agents), "in", time.Since(began).Round(time.Millisecond))
	r := &result{mode: mode, agents: len(agents), shape: s, changes: map[string]perChange{}, controller: map[string]perChange{}}
	start := total(agents)
	r.watches = float64(start.watches) / float64(len(agents))
	r.syncBytes = start.watchBytes + start.otherBytes
	for _, ch := range changes {
		before, cbefore := total(agents), total(ctl)
		for i := range k {
			if err := ch.do(ctx, admin, i); err != nil {
				return nil, fmt.Errorf("change %s: %w", ch.name, err)
			}
			settle(ctx, all, 500*time.Millisecond+time.Duration(len(agents))*2*time.Millisecond, time.Minute)
		}
		d, cd := total(agents).sub(before), total(ctl).sub(cbefore)
		r.changes[ch.name] = perChange{events: float64(d.watchEvents) / float64(k), bytes: float64(d.watchBytes) / float64(k)}
		r.controller[ch.name] = perChange{events: float64(cd.watchEvents) / float64(k), bytes: float64(cd.watchBytes) / float64(k)}
	}
	return r, nil
}
