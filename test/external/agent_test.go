package external

import (
	"context"
	"log/slog"

	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// newAgentHook builds node's hook as cmd/agent's `run` builds it: reading
// Services and EndpointSlices from the watch the agent's model shares with
// it, unless the hook is idle (then watch is nil and the model watches its
// own part). The model's informers (portal.Informers with Watch) are the
// caller's to start, if any: without them the hook starts the watch itself.
// opts are added to the agent's.
func newAgentHook(cfg config.Config, c kubernetes.Interface, node string, log *slog.Logger, opts ...external.Option) (h *external.Hook, watch *portal.ServiceWatch, err error) {
	watch = portal.NewServiceWatch(c, 0)
	h, err = external.New(cfg, c, node, log, append([]external.Option{external.WithServiceWatch(watch)}, opts...)...)
	if err != nil {
		return nil, nil, err
	}
	if h.Idle() {
		watch = nil
	}
	return h, watch, nil
}

// startModel starts the model's informers of node over watch into a
// Tracker no dataplane reads, so that the watch has both its readers, as
// in `agent run`.
func startModel(ctx context.Context, c kubernetes.Interface, node string, watch *portal.ServiceWatch) error {
	tr := portal.NewTracker(portal.Config{NodeName: node}, nil, nil)
	_, err := (&portal.Informers{Client: c, NodeName: node, Watch: watch}).Start(ctx, tr)
	return err
}
