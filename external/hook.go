package external

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/providers"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

// Hook is one process's part of the cloud hook (see role): on a node it
// computes which nodes should receive each external IP and drives the
// providers; where the cluster-wide part runs, it campaigns for the
// allocator Lease and, when elected, runs the allocator, the webhook sender
// and the refusal events.
type Hook struct {
	// cfg is the configuration in force (conf); with the custom resources
	// (Config.CRDs) it changes as they do (reload), else never.
	cfg    atomic.Pointer[config.Parsed]
	client kubernetes.Interface
	// base is the configuration file's section, to which the custom
	// resources add (crd, with the dynamic client dyn).
	base config.Config
	dyn  dynamic.Interface
	crd  *config.Watch
	role role
	// node is this node's name; empty in the controller.
	node string
	log  *slog.Logger

	// Both parts: the caches the registry reads, and the loop that tells
	// the providers. Services and slices come from watch when the agent's
	// model shares its own (WithServiceWatch), else from factory.
	factory  informers.SharedInformerFactory
	watch    *portal.ServiceWatch
	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
	nodes    cache.SharedIndexInformer
	pods     cache.SharedIndexInformer
	// When the controller settles pod external IPs (Parsed.Settles), a node
	// agent's Pods come from podFactory (its own node's alone) and grants
	// is its watch on the controller's decisions (claims.Publish); the
	// controller keeps granted, what it last wrote or read there.
	podFactory   informers.SharedInformerFactory
	grantFactory informers.SharedInformerFactory
	grants       cache.SharedIndexInformer
	// podsChanged is signalled on every Pod event (PodsChanged).
	podsChanged chan struct{}
	providers   []providers.Provider
	extra       []providers.Provider
	// starts are the providers not started yet (a failed start is tried
	// again with back-off); phealth reports every provider's state, to
	// health and metrics (WithProviderHealth).
	starts  []providerStart
	phealth *providers.Health
	health  *dataplane.HealthServer
	metrics *dataplane.Metrics
	wake    chan struct{}
	// liveWake is signalled when only the nodes' liveness changed
	// (livePoke): a takeover, looked at without the rest of the state.
	liveWake chan struct{}

	// The per-node part: this node's liveness Lease and its view of the
	// others'.
	liveness *leases.Liveness
	// beats are the heartbeats between the L2 nodes (startHeartbeat;
	// nil while off), guarded by mu.
	beats *heartbeat.Heartbeat
	// registerer, when set, holds the hook's own metrics (WithRegisterer).
	registerer prometheus.Registerer

	// Events (a node's on its Node object, the cluster-wide part's on
	// Services), the cluster-wide part's webhook sender, and the name it
	// campaigns under.
	broadcast record.EventBroadcaster
	rec       record.EventRecorder
	// leaderBroadcast writes the cluster-wide part's events (leaderRec)
	// within its leadership terms only (leases.EventSink); nil in a node
	// agent of a split install, whose leaderRec is rec.
	leaderBroadcast record.EventBroadcaster
	leaderRec       record.EventRecorder
	notifier        *webhook.Notifier
	// webhookErr is the webhook sender's last failed start (nil once
	// started); such a process does not lead.
	webhookErr error
	identity   string
	// watchdog is client-go's leader-election health check (Healthy).
	watchdog *leaderelection.HealthzAdaptor

	// regMu guards the registry, its last answer, and the addresses that
	// answer reserves (a release lets waiting Services try again).
	regMu       sync.Mutex
	registry    *claims.Registry
	own         *claims.Ownership
	reservedIPs map[netip.Addr]bool
	// refused are the Services' external IPs the registry gives to
	// someone else (nil until it ran over complete listings), and
	// refusedChanged is signalled when they change (RefusedExternalIPs).
	refused        map[portal.ServiceKey][]netip.Addr
	refusedChanged chan struct{}
	granted        *corev1.ConfigMap

	mu sync.Mutex
	// programmed is what this node's dataplane serves, per address and
	// Service (Programmed).
	programmed map[providers.Served]providers.Programmed
	// podProgrammed are the pod external IPs the dataplane maps.
	podProgrammed map[netip.Addr]bool
	// programmedSeen and podProgrammedSeen: the dataplane has told
	// programmed and podProgrammed at least once.
	programmedSeen, podProgrammedSeen bool
	// leader, alloc and reported belong to the cluster-wide part's
	// leadership term.
	leader bool
	alloc  *alloc.Allocator
	// leadCtx is the leadership term's context, nil when not leading:
	// a webhook sender that starts late leads in it (startWebhook).
	leadCtx context.Context
	// term is the running leadership term's context from its first
	// moment (termCtx); nil between terms.
	term context.Context
	// fence ends each term at its renew deadline.
	fence *leases.Fence
	// stopCampaign ends the running campaign (a held Lease is released),
	// and leadErr is why this candidate gave its Lease up, until it
	// campaigns again (Healthy).
	stopCampaign context.CancelCauseFunc
	leadErr      error
	// reported are the refusals already given an event in this leadership
	// term.
	reported map[string]bool
	// verdicts are the custom resources' last verdicts (reload), for their
	// status (config.Watch.WriteStatus).
	verdicts []config.Verdict
	// l2r is the running L2 responder, for the liveness tracker's
	// re-announcement after an outage.
	l2r *l2.Responder

	// poolsChanged starts the allocator's term again with the pools now
	// in force (reload).
	poolsChanged chan struct{}
	// moves follows the BGP next hops of the Local-policy addresses on
	// the leader (noteNextHops; Run's goroutine only).
	moves ipMoves
	// bgpPeers are this node's BGP sessions for the metrics.
	bgpPeers providers.BGPPeers
}

// role says which parts of the cloud hook one process runs. The hook has
// two, and they need different privileges:
//
//   - The cluster-wide part, run by one process at a time (elected through
//     the allocator Lease): the allocator, which writes Service status; the
//     webhook sender; and the refusal events. It must be able to update any
//     Service's status.
//   - The per-node part: the providers that announce from this node (BGP,
//     L2, the caller's own) and this node's liveness Lease, with the node's
//     own view of the registry to decide what it announces. It writes only
//     its own Lease.
//
// With the two apart (Config.SeparateController, `agent controller`), a
// compromised node can write no Service's status and no Lease but its own.
type role int

const (
	// roleAll runs both parts in every agent; the agents elect which of
	// them runs the cluster-wide part (Config.SeparateController off).
	roleAll role = iota
	// roleNode runs only the per-node part (`agent run` with
	// Config.SeparateController).
	roleNode
	// roleController runs only the cluster-wide part (`agent controller`).
	roleController
)

// node reports whether the per-node part runs.
func (r role) node() bool { return r != roleController }

// controller reports whether the cluster-wide part runs (when elected).
func (r role) controller() bool { return r != roleNode }

func (r role) String() string {
	switch r {
	case roleNode:
		return "node"
	case roleController:
		return "controller"
	}
	return "all"
}

// Option changes how New and NewController build a hook.
type Option func(*Hook)

// WithServiceWatch makes the hook read Services and EndpointSlices from w,
// the watch the agent's model reads too (portal.Informers.Watch), instead
// of watching them a second time: one watch event and one cached copy per
// object for both. The hook reads of them only what w's cache keeps
// (portal.TrimForSharedCache: of a Service its addresses, type, class,
// ports, traffic policy, selector, labels and onehop's annotations; of an
// EndpointSlice its Service's name and its endpoints' readiness and node),
// and writes a Service's status with a patch of its load-balancer ingress
// alone, never the cached object. Without it (`agent controller`) the hook
// keeps its own informers.
func WithServiceWatch(w *portal.ServiceWatch) Option {
	return func(h *Hook) { h.watch = w }
}

// WithDynamicClient gives the hook the client it watches the onehop.io
// custom resources with, and writes their status with (Config.CRDs).
func WithDynamicClient(c dynamic.Interface) Option { return func(h *Hook) { h.dyn = c } }

// WithProviderHealth makes the hook report its providers' health in the
// agent's /healthz detail (health) and metrics (m): onehop_provider_up and
// onehop_provider_failures_total. Either may be nil. Events on this node's
// Node object are written regardless.
func WithProviderHealth(health *dataplane.HealthServer, m *dataplane.Metrics) Option {
	return func(h *Hook) { h.health, h.metrics = health, m }
}

// WithRegisterer registers on reg the hook's metrics that it keeps itself
// (those of the L2 heartbeats), beside those WithProviderHealth's metrics
// hold. Without it they are not exposed.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(h *Hook) { h.registerer = reg }
}

// New builds the hook of node nodeName: its per-node part and, unless
// cfg.SeparateController, a candidate for the cluster-wide part. Nothing
// runs until Run.
func New(cfg config.Config, client kubernetes.Interface, nodeName string, log *slog.Logger, opts ...Option) (*Hook, error) {
	if nodeName == "" {
		return nil, errors.New("external: node name is required")
	}
	r := roleAll
	if cfg.SeparateController {
		r = roleNode
	}
	return newHook(cfg, client, r, nodeName, nodeName, log, opts...)
}

// Healthy is nil unless this candidate holds the allocator Lease and has
// not renewed it for a lease duration past its expiry (client-go's
// leader-election watchdog, as kube-controller-manager's /healthz uses it;
// an unreachable API server alone does not fail it: the leader steps
// down instead), or it cannot lead: it gave its Lease up for a leader's
// duty it cannot do, or its webhook sender does not start.
func (h *Hook) Healthy() error {
	if err := h.watchdog.Check(nil); err != nil {
		return err
	}
	if !h.role.controller() || !h.needsLeader() {
		return nil
	}
	h.mu.Lock()
	err := h.leadErr
	h.mu.Unlock()
	if err != nil {
		return err
	}
	if err := h.leadBlocker(); err != nil && !errors.Is(err, errNotStarted) {
		return err
	}
	return nil
}

// NewController builds the cluster-wide part of the hook alone, for
// `agent controller`: identity names this candidate in the allocator Lease
// (the pod's name). It announces nothing and holds no liveness Lease.
func NewController(cfg config.Config, client kubernetes.Interface, identity string, log *slog.Logger, opts ...Option) (*Hook, error) {
	if identity == "" {
		return nil, errors.New("external: controller identity is required")
	}
	return newHook(cfg, client, roleController, "", identity, log, opts...)
}

func newHook(cfg config.Config, client kubernetes.Interface, r role, nodeName, identity string, log *slog.Logger, opts ...Option) (*Hook, error) {
	p, err := cfg.Parse()
	if err != nil {
		return nil, fmt.Errorf("external: %w", err)
	}
	if p.BGP != nil && r.node() {
		if err := p.BGP.Validate(); err != nil {
			return nil, err
		}
	}
	h := &Hook{client: client, base: cfg, poolsChanged: make(chan struct{}, 1), role: r, node: nodeName, log: log, wake: make(chan struct{}, 1), liveWake: make(chan struct{}, 1), refusedChanged: make(chan struct{}, 1),
		programmed: map[providers.Served]providers.Programmed{}, identity: identity, registry: claims.New(p),
		watchdog: leaderelection.NewLeaderHealthzAdaptor(p.LeaderLease.Duration.Duration)}
	h.cfg.Store(p)
	for _, o := range opts {
		o(h)
	}
	h.registerMetrics()
	h.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(portal.TrimManagedFields))
	if h.watch != nil {
		h.services, h.slices = h.watch.Services(), h.watch.Slices()
	} else {
		h.services = h.factory.Core().V1().Services().Informer()
		h.slices = h.factory.Discovery().V1().EndpointSlices().Informer()
	}
	h.nodes = h.factory.Core().V1().Nodes().Informer()
	if cfg.CRDs {
		if h.dyn == nil {
			return nil, errors.New("external: crds is set, but the hook has no dynamic client (WithDynamicClient)")
		}
		o := config.WatchOptions{Dynamic: h.dyn, Client: client, Namespace: p.LeaseNamespace, Log: log,
			ClusterWide: r.controller(), NodeAgent: r == roleNode, Publisher: r == roleController, Unwatched: claims.GrantsConfigMapName}
		if r.node() {
			o.Node, o.Nodes = nodeName, h.nodes
		}
		if h.crd, err = config.NewWatch(o); err != nil {
			return nil, err
		}
	}
	if p.PodExternalIPs {
		if p.Settles() && r == roleNode {
			h.watchSettled()
		} else {
			h.pods = h.factory.Core().V1().Pods().Informer()
		}
		h.podsChanged = make(chan struct{}, 1)
		// Registered now, before anyone can call Run, so that no change is missed.
		for _, inf := range []cache.SharedIndexInformer{h.pods, h.grants} {
			if inf != nil {
				_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
					AddFunc:    func(any) { h.podsPoke() },
					UpdateFunc: func(any, any) { h.podsPoke() },
					DeleteFunc: func(any) { h.podsPoke() },
				})
			}
		}
	} else if p.Settles() && r == roleNode {
		h.watchGrants() // spec.externalIPs' holders
	}
	h.broadcast = record.NewBroadcaster()
	h.rec = h.broadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "onehop", Host: identity})
	h.leaderRec = h.rec
	if r.controller() {
		h.leaderBroadcast = record.NewBroadcaster()
		h.leaderRec = h.leaderBroadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "onehop", Host: identity})
	}
	h.phealth = providers.NewHealth(nodeName, log, h.rec, h.health, h.metrics)
	return h, nil
}

// conf is the configuration in force.
func (h *Hook) conf() *config.Parsed { return h.cfg.Load() }

// AddProvider adds a provider of the caller's (a cloud integration); call
// before Run. On a node it is told what this node serves; in the
// controller State.Node is empty and State.Leader says when to act.
func (h *Hook) AddProvider(p providers.Provider) { h.extra = append(h.extra, p) }

// Idle reports whether Run will watch nothing, as the hook is configured
// now (AddProvider changes it): nothing in the configuration is for this
// role. An agent shares its model's watch with the hook only when the hook
// uses it.
func (h *Hook) Idle() bool { return h.idle() }

// Programmed tells the hook what this node's dataplane holds now; call it
// after every successful sync. An IP is announced from here only when this
// dataplane serves it for every Service that rightfully holds it. It reads
// snap during the call and keeps nothing of it.
func (h *Hook) Programmed(snap *portal.Snapshot) {
	m := map[providers.Served]providers.Programmed{}
	for _, svc := range snap.Services {
		for _, pt := range svc.Portals {
			for _, ips := range [][]netip.Addr{pt.LoadBalancerIPs, pt.ExternalIPs} {
				for _, ip := range ips {
					k := providers.Served{IP: ip, Service: svc.Key}
					p := m[k]
					p.AnyEndpoint = p.AnyEndpoint || len(pt.ClusterEndpoints) > 0
					p.LocalEndpoint = p.LocalEndpoint || len(pt.LocalEndpoints) > 0
					m[k] = p
				}
			}
		}
	}
	h.mu.Lock()
	h.programmed, h.programmedSeen = m, true
	h.mu.Unlock()
	h.poke()
}

// ProgrammedPodIPs tells the hook which pod external IPs (PodExternalIPs)
// this node's dataplane maps now; call it after every successful sync once
// the dataplane serves them. A pod external IP is announced from its pod's
// node only after that.
func (h *Hook) ProgrammedPodIPs(ips []netip.Addr) {
	m := map[netip.Addr]bool{}
	for _, ip := range ips {
		m[ip] = true
	}
	h.mu.Lock()
	h.podProgrammed, h.podProgrammedSeen = m, true
	h.mu.Unlock()
	h.poke()
}

// PodExternalIPs returns the current pod external IP mappings, sorted by
// IP (nil unless podExternalIPs is on), for the dataplane: only Pods that
// rightfully hold their address.
func (h *Hook) PodExternalIPs() []claims.PodExternalIP {
	if h.pods == nil {
		return nil
	}
	own, _ := h.resolve()
	return own.Pods
}

// RefusedExternalIPs returns, per Service, the spec.externalIPs this
// node's dataplane must not serve because the registry gives the address
// to someone else: a refused claim is not announced, and it is not served
// either, so that a Service in one namespace cannot receive traffic sent to
// another's address on the nodes that announce it. ok is false until the
// registry has run over complete listings; the dataplane's first sync
// waits for it. A hook with nothing to do in its role runs no registry
// and refuses nothing here.
func (h *Hook) RefusedExternalIPs() (refused map[portal.ServiceKey][]netip.Addr, ok bool) {
	if h.idle() {
		return nil, true // this role watches nothing (Run): no registry here
	}
	h.regMu.Lock()
	defer h.regMu.Unlock()
	if h.refused == nil {
		return nil, false
	}
	return maps.Clone(h.refused), true
}

// RefusedExternalIPsChanged is signalled when RefusedExternalIPs changed.
func (h *Hook) RefusedExternalIPsChanged() <-chan struct{} { return h.refusedChanged }

// PodsChanged is signalled when a Pod changed, so that the dataplane can
// read PodExternalIPs again (nil unless podExternalIPs is on).
func (h *Hook) PodsChanged() <-chan struct{} { return h.podsChanged }

// Synced reports whether the hook's first listing of Services,
// EndpointSlices, Nodes, Pods (and the controller's grants) is complete,
// so that PodExternalIPs is the whole answer and not the part listed so
// far.
func (h *Hook) Synced() bool {
	return h.services.HasSynced() && h.slices.HasSynced() && h.nodes.HasSynced() && (h.pods == nil || h.pods.HasSynced()) &&
		(h.grants == nil || h.grants.HasSynced())
}

func (h *Hook) podsPoke() {
	select {
	case h.podsChanged <- struct{}{}:
	default:
	}
}

func (h *Hook) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// livePoke says that a node's liveness changed.
func (h *Hook) livePoke() {
	select {
	case h.liveWake <- struct{}{}:
	default:
	}
}

func (h *Hook) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { h.poke() },
		UpdateFunc: func(any, any) { h.poke() },
		DeleteFunc: func(any) { h.poke() },
	}
}
