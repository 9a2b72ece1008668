package external

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

// AllocatorLeaseName is the Lease the LoadBalancer IP allocator (and the
// webhook sender) is elected with.
const AllocatorLeaseName = "onehop-external"

// Hook is one process's part of the cloud hook (see role): on a node it
// computes which nodes should receive each external IP and drives the
// providers; where the cluster-wide part runs, it campaigns for the
// allocator Lease and, when elected, runs the allocator, the webhook sender
// and the refusal events.
type Hook struct {
	// cfg is the configuration in force (conf); with the custom resources
	// (Config.CRDs) it changes as they do (reload.go), else never.
	cfg    atomic.Pointer[parsed]
	client kubernetes.Interface
	// base is the configuration file's section, to which the custom
	// resources add (crd, with the dynamic client dyn).
	base Config
	dyn  dynamic.Interface
	crd  *crdWatch
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
	// When the controller settles pod external IPs (settles), a node
	// agent's Pods come from podFactory (its own node's alone) and grants
	// is its watch on the controller's decisions (grants.go); the
	// controller keeps granted, what it last wrote or read there.
	podFactory   informers.SharedInformerFactory
	grantFactory informers.SharedInformerFactory
	grants       cache.SharedIndexInformer
	// podsChanged is signalled on every Pod event (PodsChanged).
	podsChanged chan struct{}
	providers   []Provider
	extra       []Provider
	// starts are the providers not started yet (a failed start is tried
	// again with back-off); phealth reports every provider's state.
	starts  []providerStart
	phealth providerHealth
	wake    chan struct{}
	// liveWake is signalled when only the nodes' liveness changed
	// (livePoke): a takeover, looked at without the rest of the state.
	liveWake chan struct{}

	// The per-node part: this node's liveness Lease and its view of the
	// others'.
	leaseInf informers.SharedInformerFactory
	liveness *liveness
	// beats are the heartbeats between the L2 nodes (l2heartbeat.go;
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
	// within its leadership terms only (leaderEventSink); nil in a node
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
	registry    *registry
	own         *ownership
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
	programmed map[served]programmed
	// podProgrammed are the pod external IPs the dataplane maps.
	podProgrammed map[netip.Addr]bool
	// leader, alloc and reported belong to the cluster-wide part's
	// leadership term.
	leader bool
	alloc  *allocator
	// leadCtx is the leadership term's context, nil when not leading:
	// a webhook sender that starts late leads in it (startWebhook).
	leadCtx context.Context
	// term is the running leadership term's context from its first
	// moment (termCtx); nil between terms.
	term context.Context
	// fence ends each term at its renew deadline (leaseFence).
	fence leaseFence
	// stopCampaign ends the running campaign (a held Lease is released),
	// and leadErr is why this candidate gave its Lease up, until it
	// campaigns again (Healthy).
	stopCampaign context.CancelCauseFunc
	leadErr      error
	// reported are the refusals already given an event in this leadership
	// term.
	reported map[string]bool
	// verdicts are the custom resources' last verdicts (reload), for their
	// status (crdstatus.go).
	verdicts []verdict
	// l2r is the running L2 responder, for the liveness tracker's
	// re-announcement after an outage.
	l2r *l2.Responder

	// poolsChanged starts the allocator's term again with the pools now
	// in force (reload).
	poolsChanged chan struct{}
	// statusSent is the status last written to each custom resource
	// (Run's goroutine only).
	statusSent map[string]crdStatus
	// moves follows the BGP next hops of the Local-policy addresses on
	// the leader (ipmoves.go; Run's goroutine only).
	moves ipMoves
	// bgpPeers are this node's BGP sessions for the metrics.
	bgpPeers bgpPeers
}

// New builds the hook of node nodeName: its per-node part and, unless
// cfg.SeparateController, a candidate for the cluster-wide part. Nothing
// runs until Run.
func New(cfg Config, client kubernetes.Interface, nodeName string, log *slog.Logger, opts ...Option) (*Hook, error) {
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
func NewController(cfg Config, client kubernetes.Interface, identity string, log *slog.Logger, opts ...Option) (*Hook, error) {
	if identity == "" {
		return nil, errors.New("external: controller identity is required")
	}
	return newHook(cfg, client, roleController, "", identity, log, opts...)
}

func newHook(cfg Config, client kubernetes.Interface, r role, nodeName, identity string, log *slog.Logger, opts ...Option) (*Hook, error) {
	p, err := cfg.parse()
	if err != nil {
		return nil, fmt.Errorf("external: %w", err)
	}
	if p.BGP != nil && r.node() {
		if err := p.BGP.Validate(); err != nil {
			return nil, err
		}
	}
	h := &Hook{client: client, base: cfg, poolsChanged: make(chan struct{}, 1), role: r, node: nodeName, log: log, wake: make(chan struct{}, 1), liveWake: make(chan struct{}, 1), refusedChanged: make(chan struct{}, 1),
		programmed: map[served]programmed{}, identity: identity, registry: newRegistry(p),
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
		if err := h.watchCRDs(); err != nil {
			return nil, err
		}
	}
	if p.PodExternalIPs {
		if p.settles() && r == roleNode {
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
	} else if p.settles() && r == roleNode {
		h.watchGrants() // spec.externalIPs' holders
	}
	h.broadcast = record.NewBroadcaster()
	h.rec = h.broadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "onehop", Host: identity})
	h.leaderRec = h.rec
	if r.controller() {
		h.leaderBroadcast = record.NewBroadcaster()
		h.leaderRec = h.leaderBroadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "onehop", Host: identity})
	}
	h.phealth.node, h.phealth.log, h.phealth.rec = nodeName, log, h.rec
	return h, nil
}

// conf is the configuration in force.
func (h *Hook) conf() *parsed { return h.cfg.Load() }

// AddProvider adds a provider of the caller's (a cloud integration); call
// before Run. On a node it is told what this node serves; in the
// controller State.Node is empty and State.Leader says when to act.
func (h *Hook) AddProvider(p Provider) { h.extra = append(h.extra, p) }

// Programmed tells the hook what this node's dataplane holds now; call it
// after every successful sync. An IP is announced from here only when this
// dataplane serves it for every Service that rightfully holds it. It reads
// snap during the call and keeps nothing of it.
func (h *Hook) Programmed(snap *portal.Snapshot) {
	m := map[served]programmed{}
	for _, svc := range snap.Services {
		for _, pt := range svc.Portals {
			for _, ips := range [][]netip.Addr{pt.LoadBalancerIPs, pt.ExternalIPs} {
				for _, ip := range ips {
					k := served{ip, svc.Key}
					p := m[k]
					p.anyEndpoint = p.anyEndpoint || len(pt.ClusterEndpoints) > 0
					p.localEndpoint = p.localEndpoint || len(pt.LocalEndpoints) > 0
					m[k] = p
				}
			}
		}
	}
	h.mu.Lock()
	h.programmed = m
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
	h.podProgrammed = m
	h.mu.Unlock()
	h.poke()
}

// PodExternalIPs returns the current pod external IP mappings, sorted by
// IP (nil unless podExternalIPs is on), for the dataplane: only Pods that
// rightfully hold their address.
func (h *Hook) PodExternalIPs() []PodExternalIP {
	if h.pods == nil {
		return nil
	}
	own, _ := h.resolve()
	return own.pods
}

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

func (h *Hook) nodeAddrs(name string) []netip.Addr {
	obj, ok, _ := h.nodes.GetStore().GetByKey(name)
	if !ok {
		return nil
	}
	var out []netip.Addr
	for _, a := range obj.(*corev1.Node).Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
