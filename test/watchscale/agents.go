package watchscale

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// agent is one simulated node agent: the watches `agent run` starts, with
// no dataplane behind them.
type agent struct {
	node   string
	count  *counter
	synced func() bool
	done   chan struct{}
}

// clientFor returns a client of rc whose transport counts into c. It
// speaks JSON, client-go's default and the agent's unless configured, so
// that each watch event is one line.
func clientFor(rc *rest.Config, c *counter) (kubernetes.Interface, error) {
	cc := rest.CopyConfig(rc)
	cc.ContentType = "application/json"
	cc.AcceptContentTypes = "application/json"
	cc.QPS, cc.Burst = 50, 100
	cc.Wrap(c.wrap)
	return kubernetes.NewForConfig(cc)
}

// startAgent starts node's agent: the model's informers (portal.Informers,
// as `agent run` builds them, sharing their watch of Services and
// EndpointSlices with the hook) and the cloud hook of cfg (external.New
// and Run, with no provider that needs the kernel).
// Unshared, they watch Services and EndpointSlices each on their own, as
// before portal.ServiceWatch (the comparison of heap_test.go).
func startAgent(ctx context.Context, rc *rest.Config, node string, cfg config.Config, shared bool) (*agent, error) {
	a := &agent{node: node, count: &counter{}, done: make(chan struct{})}
	client, err := clientFor(rc, a.count)
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var watch *portal.ServiceWatch
	var opts []external.Option
	if shared {
		watch = portal.NewServiceWatch(client, 0)
		opts = append(opts, external.WithServiceWatch(watch))
	}
	hook, err := external.New(cfg, client, node, quiet, opts...)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", node, err)
	}
	if hook.Idle() {
		watch = nil
	}
	tracker := portal.NewTracker(portal.Config{NodeName: node}, nil, nil)
	synced, err := (&portal.Informers{Client: client, NodeName: node, Watch: watch}).Start(ctx, tracker)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", node, err)
	}
	go func() {
		defer close(a.done)
		_ = hook.Run(ctx)
	}()
	a.synced = func() bool { return synced() && hook.Synced() }
	return a, nil
}

// startController starts `agent controller`'s hook (external.NewController),
// counted apart from the agents.
func startController(ctx context.Context, rc *rest.Config, cfg config.Config) (*agent, error) {
	a := &agent{node: "controller", count: &counter{}, done: make(chan struct{})}
	client, err := clientFor(rc, a.count)
	if err != nil {
		return nil, err
	}
	hook, err := external.NewController(cfg, client, "onehop-controller-0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(a.done)
		_ = hook.Run(ctx)
	}()
	a.synced = hook.Synced
	return a, nil
}

// waitSynced waits until every agent's first listing is complete.
func waitSynced(ctx context.Context, agents []*agent) error {
	for _, a := range agents {
		for !a.synced() {
			select {
			case <-ctx.Done():
				return fmt.Errorf("agent %s did not sync: %w", a.node, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// total sums the agents' counters.
func total(agents []*agent) snapshot {
	var s snapshot
	for _, a := range agents {
		s = s.add(a.count.snapshot())
	}
	return s
}

// settle waits until no agent received a watch event for quiet (at most
// max), so that a change has reached everyone it reaches.
func settle(ctx context.Context, agents []*agent, quiet, max time.Duration) {
	deadline := time.Now().Add(max)
	last, since := total(agents).watchEvents, time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		if n := total(agents).watchEvents; n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) >= quiet {
			return
		}
	}
}
