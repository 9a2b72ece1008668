package external

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/l2"
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
	mu          sync.Mutex
	programmed  map[netip.Addr]programmed
	// podProgrammed are the pod external IPs the dataplane maps.
	podProgrammed map[netip.Addr]bool
	leader        bool
	alloc         *allocator
	// reported are the refused spec.externalIPs already given an event in
	// this leadership term.
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
		programmed: map[netip.Addr]programmed{}, identity: nodeName}
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
// after every successful sync. Only IPs programmed here are announced from
// here. It reads snap during the call and keeps nothing of it.
func (h *Hook) Programmed(snap *portal.Snapshot) {
	m := map[netip.Addr]programmed{}
	for _, svc := range snap.Services {
		for _, pt := range svc.Portals {
			for _, ips := range [][]netip.Addr{pt.LoadBalancerIPs, pt.ExternalIPs} {
				for _, ip := range ips {
					p := m[ip]
					p.anyEndpoint = p.anyEndpoint || len(pt.ClusterEndpoints) > 0
					p.localEndpoint = p.localEndpoint || len(pt.LocalEndpoints) > 0
					m[ip] = p
				}
			}
		}
	}
	h.mu.Lock()
	for ip := range h.podProgrammed {
		p := m[ip]
		p.pod = true
		m[ip] = p
	}
	h.programmed = m
	h.mu.Unlock()
	h.poke()
}

// ProgrammedPodIPs tells the hook which pod external IPs (PodExternalIPs)
// this node's dataplane maps now; call it after every successful sync once
// the dataplane serves them. A pod external IP is announced from its pod's
// node only after that.
func (h *Hook) ProgrammedPodIPs(ips []netip.Addr) {
	h.mu.Lock()
	h.podProgrammed = map[netip.Addr]bool{}
	m := maps.Clone(h.programmed)
	for ip, p := range m {
		p.pod = false
		m[ip] = p
	}
	for _, ip := range ips {
		h.podProgrammed[ip] = true
		p := m[ip]
		p.pod = true
		m[ip] = p
	}
	h.programmed = m
	h.mu.Unlock()
	h.poke()
}

// PodExternalIPs returns the current pod external IP mappings (nil unless
// podExternalIPs is on), for the dataplane.
func (h *Hook) PodExternalIPs() []PodExternalIP {
	if h.pods == nil {
		return nil
	}
	var pods []*corev1.Pod
	for _, o := range h.pods.GetStore().List() {
		pods = append(pods, o.(*corev1.Pod))
	}
	out, _ := PodExternalIPs(pods, h.cfg.podIPAllowed)
	return out
}

// PodsChanged is signalled when a Pod changed, so that the dataplane can
// read PodExternalIPs again (nil unless podExternalIPs is on).
func (h *Hook) PodsChanged() <-chan struct{} { return h.podsChanged }

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

func (h *Hook) startProviders(ctx context.Context) error {
	if c := h.cfg.BGP; c != nil {
		var internal []netip.Addr
		if obj, ok, _ := h.nodes.GetStore().GetByKey(h.node); ok {
			for _, a := range obj.(*corev1.Node).Status.Addresses {
				if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
					internal = append(internal, ip)
				}
			}
		}
		sp, err := bgp.NewSpeaker(*c, internal, h.log.With("provider", "bgp"))
		if err != nil {
			return err
		}
		if err := sp.Start(ctx); err != nil {
			return err
		}
		h.providers = append(h.providers, &bgpProvider{sp: sp})
	}
	if c := h.cfg.L2; c != nil {
		ifaces := c.Interfaces
		if len(ifaces) == 0 {
			name, err := interfaceOf(h.nodeAddrs(h.node))
			if err != nil {
				return err
			}
			ifaces = []string{name}
		}
		r, err := l2.NewResponder(ifaces, h.log.With("provider", "l2"))
		if err != nil {
			return err
		}
		sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
		h.liveness = newLiveness(h.client, h.cfg.LeaseNamespace, h.node, sec(c.LeaseRenewSeconds), sec(c.LeaseDurationSeconds), h.log, h.poke)
		h.providers = append(h.providers, &l2Provider{r: r})
	}
	if c := h.cfg.Webhook; c != nil {
		n, err := webhook.New(*c, h.log.With("provider", "webhook"), h.webhookFailed, nil)
		if err != nil {
			return err
		}
		h.notifier = n
		h.providers = append(h.providers, &webhookProvider{n: n})
	}
	h.providers = append(h.providers, h.extra...)
	return nil
}

// webhookFailed puts an event on the Service (first and every 5th attempt).
func (h *Hook) webhookFailed(service string, err error, attempt int) {
	if attempt != 1 && attempt%5 != 0 {
		return
	}
	obj, ok, _ := h.services.GetStore().GetByKey(service) // "namespace/name", as the store keys
	if !ok {
		return
	}
	h.rec.Eventf(obj.(*corev1.Service), corev1.EventTypeWarning, "WebhookFailed", "attempt %d: %v", attempt, err)
}

func (h *Hook) state() *State {
	in := targetInput{}
	for _, o := range h.services.GetStore().List() {
		in.services = append(in.services, o.(*corev1.Service))
	}
	for _, o := range h.slices.GetStore().List() {
		in.slices = append(in.slices, o.(*discoveryv1.EndpointSlice))
	}
	for _, o := range h.nodes.GetStore().List() {
		in.nodes = append(in.nodes, o.(*corev1.Node))
	}
	h.mu.Lock()
	leader := h.leader
	prog := h.programmed
	h.mu.Unlock()
	if h.pods != nil {
		var pods []*corev1.Pod
		for _, o := range h.pods.GetStore().List() {
			pods = append(pods, o.(*corev1.Pod))
		}
		var refusals []PodRefusal
		in.pods, refusals = PodExternalIPs(pods, h.cfg.podIPAllowed)
		if leader {
			for _, r := range refusals {
				h.rec.Event(r.Pod, corev1.EventTypeWarning, r.Reason, r.Msg)
			}
		}
	}
	if leader {
		h.reportExternalIPs(in.services)
	}
	st := &State{Node: h.node, Leader: leader, Targets: h.cfg.targets(in), NodeAddresses: map[string][]netip.Addr{}, programmed: prog}
	for _, n := range in.nodes {
		st.NodeAddresses[n.Name] = h.nodeAddrs(n.Name)
	}
	if h.liveness != nil {
		st.alive = h.liveness.alive
	}
	return st
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

func (h *Hook) allocEnqueue(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	svc, ok := o.(*corev1.Service)
	if !ok {
		return
	}
	h.mu.Lock()
	a := h.alloc
	h.mu.Unlock()
	if a != nil {
		a.enqueue(svc)
	}
}

// lead campaigns for the allocator Lease until ctx ends; while leader it
// runs the allocator and lets the webhook send.
func (h *Hook) lead(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaOf(h.cfg.LeaseNamespace, AllocatorLeaseName),
		Client:     h.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: h.identity},
	}
	t := h.cfg.LeaderLease
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: t.Duration.Duration, RenewDeadline: t.RenewDeadline.Duration, RetryPeriod: t.RetryPeriod.Duration,
			ReleaseOnCancel: true, Name: AllocatorLeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: h.leading,
				OnStoppedLeading: func() {
					h.mu.Lock()
					h.leader, h.alloc, h.reported = false, nil, nil
					h.mu.Unlock()
					h.log.Info("external: lost allocator lease", "node", h.node)
					h.poke()
				},
			},
		})
		if err != nil {
			h.log.Error("external: leader election", "err", err)
			return
		}
		le.Run(ctx)
	}
}

func (h *Hook) leading(ctx context.Context) {
	h.log.Info("external: holding allocator lease", "node", h.node)
	var a *allocator
	if len(h.cfg.pools) > 0 {
		var err error
		a, err = newAllocator(h.cfg, h.client, h.factory.Core().V1().Services().Lister(), h.rec, h.log.With("component", "ipam"))
		if err != nil {
			h.log.Error("external: allocator", "err", err)
			return
		}
		if err := a.rebuild(); err != nil {
			h.log.Error("external: rebuild allocation state", "err", err)
			return
		}
	}
	h.mu.Lock()
	h.leader, h.alloc = true, a
	h.mu.Unlock()
	h.poke()
	if a != nil {
		a.run(ctx)
	} else {
		<-ctx.Done()
	}
}

func metaOf(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}

// reportExternalIPs puts one event per leadership term on each Service for
// each spec.externalIPs entry outside ExternalIPCIDRs and the pools (the
// dataplane does not serve those).
func (h *Hook) reportExternalIPs(svcs []*corev1.Service) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reported == nil {
		h.reported = map[string]bool{}
	}
	for _, svc := range svcs {
		for _, s := range svc.Spec.ExternalIPs {
			a, err := netip.ParseAddr(s)
			if err == nil && h.cfg.externalIPAllowed(a) {
				continue
			}
			k := string(svc.UID) + "/" + s
			if h.reported[k] {
				continue
			}
			h.reported[k] = true
			h.rec.Eventf(svc, corev1.EventTypeWarning, "ExternalIPNotAllowed",
				"spec.externalIPs %q is outside --external-ip-cidrs and the address pools; it is not served", s)
		}
	}
}
