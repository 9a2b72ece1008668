package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/onehop/onehop/config"
	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external"
	extconfig "github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// hookWiring is what the cloud hook of a node agent is wired to.
type hookWiring struct {
	settings *config.Settings
	extCIDRs []netip.Prefix // the settings' externalIPCIDRs, parsed
	rest     *rest.Config
	client   kubernetes.Interface
	node     string
	log      *slog.Logger
	reg      prometheus.Registerer
	health   *dataplane.HealthServer // nil without a health server
	metrics  *dataplane.Metrics
	runner   *dataplane.Runner
	tracker  *portal.Tracker
}

// nodeHook is the cloud hook as a node agent runs it; the zero value is
// no hook.
type nodeHook struct {
	watch        *portal.ServiceWatch // shared with the cloud hook
	podIPsReady  *atomic.Bool         // set when pod external IPs are served
	refusedReady *atomic.Bool         // set when the registry's refusals are known
	done         chan struct{}        // closed once the hook has stopped
}

// ready says whether what the hook hands the model is there for the
// first sync: the pod external IPs and the registry's refusals.
func (h *nodeHook) ready() bool {
	return (h.podIPsReady == nil || h.podIPsReady.Load()) && (h.refusedReady == nil || h.refusedReady.Load())
}

// wait returns once the hook has stopped (its announcements withdrawn).
func (h *nodeHook) wait() {
	if h.done != nil {
		<-h.done
	}
}

// startNodeHook starts the cloud hook of the settings' external section on
// this node, until ctx ends: it follows each sync the runner applies and
// hands the tracker the pod external IPs and the registry's refusals.
func startNodeHook(ctx context.Context, w hookWiring) (*nodeHook, error) {
	f, log, runner, tracker, node := w.settings, w.log, w.runner, w.tracker, w.node
	h := &nodeHook{}
	ec, err := extconfig.Decode(f.External)
	if err != nil {
		return nil, fmt.Errorf("%s: external section: %w", f.Config, err)
	}
	if len(ec.ExternalIPCIDRs) == 0 {
		for _, p := range w.extCIDRs {
			ec.ExternalIPCIDRs = append(ec.ExternalIPCIDRs, p.String())
		}
	}
	// One watch of Services and EndpointSlices for the model and the
	// hook, which needs them all (external.WithServiceWatch).
	h.watch = portal.NewServiceWatch(w.client, 0)
	// A provider that cannot start or update shows in /healthz's
	// providerFailures, onehop_provider_up and events on this Node.
	dyn, err := dynamic.NewForConfig(w.rest) // the onehop.io custom resources (external.crds)
	if err != nil {
		return nil, err
	}
	hook, err := external.New(ec, w.client, node, log, external.WithServiceWatch(h.watch), external.WithProviderHealth(w.health, w.metrics),
		external.WithDynamicClient(dyn), external.WithRegisterer(w.reg))
	if err != nil {
		return nil, fmt.Errorf("%s: external section: %w", f.Config, err)
	}
	if hook.Idle() {
		h.watch = nil // the model watches only its part
	}
	if ec.SeparateController {
		log.Info("cloud hook: this agent runs the per-node part only; `agent controller` allocates, writes Service status and drives the webhook")
	}
	runner.OnApplied(hook.Programmed)
	if ec.PodExternalIPs {
		runner.OnApplied(func(snap *portal.Snapshot) {
			ips := make([]netip.Addr, 0, len(snap.Node.PodExternalIPs))
			for _, p := range snap.Node.PodExternalIPs {
				ips = append(ips, p.External)
			}
			hook.ProgrammedPodIPs(ips)
		})
		h.podIPsReady = &atomic.Bool{}
		go followPodExternalIPs(ctx, hook, tracker, node, h.podIPsReady)
	}
	h.refusedReady = &atomic.Bool{}
	go followRefusedExternalIPs(ctx, hook, tracker, h.refusedReady)
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		if err := hook.Run(ctx); err != nil {
			log.Error("cloud hook stopped", "err", err)
			// Without the hook no registry refuses anything: serve
			// rather than wait for it for ever.
			h.refusedReady.Store(true)
		}
	}()
	return h, nil
}

// followRefusedExternalIPs keeps the model's list of external IPs that the
// cloud hook's registry gives to someone else up to date; ready is set once
// the registry ran over complete listings.
func followRefusedExternalIPs(ctx context.Context, hook *external.Hook, tracker *portal.Tracker, ready *atomic.Bool) {
	poll := time.NewTicker(50 * time.Millisecond) // until the registry has run
	defer poll.Stop()
	for {
		if refused, ok := hook.RefusedExternalIPs(); ok {
			tracker.SetRefusedExternalIPs(refused)
			if !ready.Load() {
				ready.Store(true)
				poll.Stop()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		case <-hook.RefusedExternalIPsChanged():
		}
	}
}

// followPodExternalIPs hands the tracker the external IPs of this node's
// pods, as the hook computes them from Pods, whenever a Pod changes (and
// every 30 s, in case a change was coalesced away).
// ready is set once the tracker holds what the hook's complete first
// listing says.
func followPodExternalIPs(ctx context.Context, hook *external.Hook, tracker *portal.Tracker, node string, ready *atomic.Bool) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	poll := time.NewTicker(50 * time.Millisecond) // until the first listing is complete
	defer poll.Stop()
	for {
		synced := hook.Synced()
		var mine []portal.PodExternalIP
		for _, p := range hook.PodExternalIPs() {
			if p.NodeName == node {
				mine = append(mine, portal.PodExternalIP{External: p.IP, Pod: p.PodIP, Name: p.Pod})
			}
		}
		tracker.SetPodExternalIPs(mine)
		if synced && !ready.Load() {
			ready.Store(true)
			poll.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-poll.C:
		case <-hook.PodsChanged():
		}
	}
}
