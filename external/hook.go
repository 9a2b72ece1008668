package external

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

// AllocatorLeaseName is the Lease the LoadBalancer IP allocator (and the
// webhook sender) is elected with.
const AllocatorLeaseName = "onehop-external"

// Hook is one agent's part of the cloud hook: it runs the allocator when
// elected, computes which nodes should receive each external IP, and drives
// the providers.
type Hook struct {
	cfg    *parsed
	client kubernetes.Interface
	node   string
	log    *slog.Logger

	factory  informers.SharedInformerFactory
	leaseInf informers.SharedInformerFactory
	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
	nodes    cache.SharedIndexInformer
	pods     cache.SharedIndexInformer
	// podsChanged is signalled on every Pod event (PodsChanged).
	podsChanged chan struct{}
	broadcast   record.EventBroadcaster
	rec         record.EventRecorder
	providers   []Provider
	extra       []Provider
	liveness    *liveness
	wake        chan struct{}
	notifier    *webhook.Notifier
	identity    string

	// regMu guards the registry, its last answer, and the addresses that
	// answer reserves (a release lets waiting Services try again).
	regMu       sync.Mutex
	registry    *registry
	own         *ownership
	reservedIPs map[netip.Addr]bool

	mu sync.Mutex
	// programmed is what this node's dataplane serves, per address and
	// Service (Programmed).
	programmed map[served]programmed
	// podProgrammed are the pod external IPs the dataplane maps.
	podProgrammed map[netip.Addr]bool
	leader        bool
	alloc         *allocator
	// reported are the refusals already given an event in this leadership
	// term.
	reported map[string]bool
}

// New builds the hook of node nodeName. Nothing runs until Run.
func New(cfg Config, client kubernetes.Interface, nodeName string, log *slog.Logger) (*Hook, error) {
	p, err := cfg.parse()
	if err != nil {
		return nil, fmt.Errorf("external: %w", err)
	}
	if nodeName == "" {
		return nil, errors.New("external: node name is required")
	}
	if p.BGP != nil {
		if err := p.BGP.Validate(); err != nil {
			return nil, err
		}
	}
	h := &Hook{cfg: p, client: client, node: nodeName, log: log, wake: make(chan struct{}, 1),
		programmed: map[served]programmed{}, identity: nodeName, registry: newRegistry(p)}
	h.factory = informers.NewSharedInformerFactory(client, 0)
	h.services = h.factory.Core().V1().Services().Informer()
	h.slices = h.factory.Discovery().V1().EndpointSlices().Informer()
	h.nodes = h.factory.Core().V1().Nodes().Informer()
	if p.PodExternalIPs {
		h.pods = h.factory.Core().V1().Pods().Informer()
		h.podsChanged = make(chan struct{}, 1)
		// Registered now, before anyone can call Run, so that no change is missed.
		_, _ = h.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { h.podsPoke() },
			UpdateFunc: func(any, any) { h.podsPoke() },
			DeleteFunc: func(any) { h.podsPoke() },
		})
	}
	h.broadcast = record.NewBroadcaster()
	h.rec = h.broadcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "onehop", Host: nodeName})
	return h, nil
}

// AddProvider adds a provider of the caller's (a cloud integration); call
// before Run.
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
// EndpointSlices, Nodes and Pods is complete, so that PodExternalIPs is
// the whole answer and not the part listed so far.
func (h *Hook) Synced() bool {
	return h.services.HasSynced() && h.slices.HasSynced() && h.nodes.HasSynced() && (h.pods == nil || h.pods.HasSynced())
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

func (h *Hook) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { h.poke() },
		UpdateFunc: func(any, any) { h.poke() },
		DeleteFunc: func(any) { h.poke() },
	}
}

// Run runs until ctx ends; then it withdraws every announcement (providers'
// Close) before returning.
func (h *Hook) Run(ctx context.Context) error {
	h.broadcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: h.client.CoreV1().Events("")})
	defer h.broadcast.Shutdown()
	for _, inf := range []cache.SharedIndexInformer{h.services, h.slices, h.nodes, h.pods} {
		if inf != nil {
			if _, err := inf.AddEventHandler(h.handler()); err != nil {
				return err
			}
		}
	}
	h.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { h.allocEnqueue(o) },
		UpdateFunc: func(_, o any) { h.allocEnqueue(o) },
		DeleteFunc: func(o any) { h.allocEnqueue(o) },
	})
	h.factory.Start(ctx.Done())
	defer h.factory.Shutdown()
	for t, ok := range h.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("external: cache of %v did not sync", t)
		}
	}
	if err := h.startProviders(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	if h.needsLeader() {
		wg.Go(func() { h.lead(ctx) })
	}
	if h.liveness != nil {
		h.leaseInf = informers.NewSharedInformerFactoryWithOptions(h.client, 0, informers.WithNamespace(h.cfg.LeaseNamespace))
		li := h.leaseInf.Coordination().V1().Leases().Informer()
		h.liveness.mu.Lock()
		h.liveness.synced = li.HasSynced
		h.liveness.mu.Unlock()
		li.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { h.liveness.observe(o.(*coordinationv1.Lease)) },
			UpdateFunc: func(_, o any) { h.liveness.observe(o.(*coordinationv1.Lease)) },
			DeleteFunc: func(o any) {
				if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				if l, ok := o.(*coordinationv1.Lease); ok {
					h.liveness.forget(l.Name)
				}
			},
		})
		h.leaseInf.Start(ctx.Done())
		defer h.leaseInf.Shutdown()
		wg.Go(func() { h.liveness.run(ctx) })
	}
	if h.notifier != nil {
		h.notifier.Start(ctx)
	}
	tick := time.NewTicker(250 * time.Millisecond) // liveness expiry is time-driven
	defer tick.Stop()
	var last string
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
			continue
		case <-h.wake:
		case <-tick.C:
		}
		st := h.state()
		if fp := fingerprint(st); fp == last {
			continue
		} else {
			last = fp
		}
		for _, p := range h.providers {
			if err := p.Update(ctx, st); err != nil {
				h.log.Warn("provider update failed", "provider", p.Name(), "err", err)
			}
		}
	}
	// Withdraw first: routers must stop sending here before the dataplane goes.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range h.providers {
		if err := p.Close(cctx); err != nil {
			h.log.Warn("provider close failed", "provider", p.Name(), "err", err)
		}
	}
	wg.Wait()
	if h.notifier != nil {
		h.notifier.Wait()
	}
	return nil
}

func (h *Hook) needsLeader() bool {
	return len(h.cfg.pools) > 0 || h.cfg.Webhook != nil || h.cfg.PodExternalIPs
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

// fingerprint: providers are called again only when something they can see
// changed (including liveness and what this node serves).
func fingerprint(s *State) string {
	b := fmt.Appendf(nil, "%v|", s.Leader)
	for _, t := range s.Targets {
		b = fmt.Appendf(b, "%s %s %v %v %d %v;", t.IP, t.Service, t.Local, t.Nodes, t.HealthCheckNodePort, t.Ports)
	}
	for _, ip := range s.IPs() {
		b = fmt.Appendf(b, "%s:%v:", ip, s.Serves(ip))
		for _, n := range s.Eligible(ip) {
			b = fmt.Appendf(b, "%s=%v,", n, s.Alive(n))
		}
	}
	b = fmt.Appendf(b, "%v", s.NodeAddresses)
	return string(b)
}
