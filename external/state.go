package external

import (
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/record"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/providers"
	"github.com/onehop/onehop/portal"
)

// resolve runs the registry over the informers' current state and keeps
// the answer for the allocator (Reserved) and PodExternalIPs.
func (h *Hook) resolve() (*claims.Ownership, claims.Input) {
	var in claims.Input
	for _, o := range h.services.GetStore().List() {
		in.Services = append(in.Services, o.(*corev1.Service))
	}
	for _, o := range h.nodes.GetStore().List() {
		in.Nodes = append(in.Nodes, o.(*corev1.Node))
	}
	if h.pods != nil {
		for _, o := range h.pods.GetStore().List() {
			in.Pods = append(in.Pods, o.(*corev1.Pod))
		}
	}
	if h.grants != nil && h.pods != nil {
		in.Pods, in.Settled = claims.SettledPods(in.Pods, h.currentGrants()), true
	}
	synced := h.Synced()
	h.regMu.Lock()
	in.External = h.externalGrants()
	own := h.registry.Resolve(in)
	h.own = own
	h.noteRefused(own, synced)
	released := false
	for ip := range h.reservedIPs {
		if own.Reserved(ip) == "" {
			released = true
		}
	}
	h.reservedIPs = map[netip.Addr]bool{}
	for ip := range own.Held {
		if own.Reserved(ip) != "" {
			h.reservedIPs[ip] = true
		}
	}
	h.regMu.Unlock()
	if released {
		h.mu.Lock()
		a := h.alloc
		h.mu.Unlock()
		if a != nil {
			a.RetryWaiting()
		}
	}
	return own, in
}

// reserved is the allocator's view of addresses held by others than
// load-balancer allocations (the registry's last answer).
func (h *Hook) reserved(ip netip.Addr) string {
	h.regMu.Lock()
	defer h.regMu.Unlock()
	return h.own.Reserved(ip)
}

// state is what the providers are told now.
func (h *Hook) state() *providers.State {
	own, rin := h.resolve()
	in := providers.TargetInput{Services: rin.Services, Nodes: rin.Nodes, Own: own}
	for _, o := range h.slices.GetStore().List() {
		in.Slices = append(in.Slices, o.(*discoveryv1.EndpointSlice))
	}
	h.mu.Lock()
	leader := h.leader
	prog, podIPs := h.programmed, h.podProgrammed
	reported := h.programmedSeen && (h.pods == nil || h.podProgrammedSeen)
	h.mu.Unlock()
	if leader {
		h.report(own.Refusals)
	}
	tgs, cluster := providers.Targets(in)
	st := providers.State{Node: h.node, Leader: leader, Targets: tgs, NodeAddresses: map[string][]netip.Addr{}}
	v := providers.View{Programmed: prog, PodIPs: podIPs, Reported: reported, Cluster: cluster}
	for _, n := range in.Nodes {
		st.NodeAddresses[n.Name] = h.nodeAddrs(n.Name)
	}
	if h.liveness != nil {
		v.Alive = h.liveness.Alive
	}
	conf := h.conf()
	v.Ann = conf.Announcer(h.nodeLabels)
	if v.Ann != nil {
		v.Ann.Kept = alloc.KeptPools(conf, in.Services)
	}
	return providers.NewState(st, v)
}

// noteRefused records the refused external IPs of the registry's latest
// answer, over complete listings (synced); called with h.regMu held.
func (h *Hook) noteRefused(own *claims.Ownership, synced bool) {
	if !synced {
		return
	}
	now := own.RefusedExternal()
	if h.refused != nil && maps.EqualFunc(now, h.refused, slices.Equal) {
		return
	}
	h.refused = now
	select {
	case h.refusedChanged <- struct{}{}:
	default:
	}
}

// watchSettled makes a node agent's hook watch what the controller
// settles: its own node's Pods (spec.nodeName) and the grants ConfigMap.
func (h *Hook) watchSettled() {
	h.podFactory = informers.NewSharedInformerFactoryWithOptions(h.client, 0, informers.WithTransform(portal.TrimManagedFields),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", h.node).String()
		}))
	h.pods = h.podFactory.Core().V1().Pods().Informer()
	h.watchGrants()
}

// watchGrants makes a node agent's hook watch the grants ConfigMap.
func (h *Hook) watchGrants() {
	h.grantFactory = informers.NewSharedInformerFactoryWithOptions(h.client, 0, informers.WithNamespace(h.conf().LeaseNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", claims.GrantsConfigMapName).String()
		}))
	h.grants = h.grantFactory.Core().V1().ConfigMaps().Informer()
}

// currentGrants are the grants a node agent follows now.
func (h *Hook) currentGrants() []claims.Grant {
	cm := h.grantsConfigMap()
	gs, err := claims.DecodeGrants(cm)
	if err != nil {
		h.log.Error("external: pod external IP grants unreadable; mapping none", "err", err)
		return nil
	}
	return gs
}

// grantsConfigMap is the grants ConfigMap as a node agent sees it now
// (nil when there is none).
func (h *Hook) grantsConfigMap() *corev1.ConfigMap {
	obj, ok, _ := h.grants.GetStore().GetByKey(h.conf().LeaseNamespace + "/" + claims.GrantsConfigMapName)
	if !ok {
		return nil
	}
	return obj.(*corev1.ConfigMap)
}

// externalGrants are the spec.externalIPs grants the registry follows: on
// a node agent the ConfigMap it watches, in the controller what it last
// wrote or read there (granted; called with regMu held). Elsewhere none.
func (h *Hook) externalGrants() map[netip.Addr]string {
	var cm *corev1.ConfigMap
	switch {
	case h.role == roleController:
		cm = h.granted
	case h.grants != nil:
		cm = h.grantsConfigMap()
	default:
		return nil
	}
	gs, err := claims.DecodeExternalGrants(cm)
	if err != nil {
		h.log.Error("external: external IP grants unreadable; the oldest claim holds each address", "err", err)
	}
	return gs
}

// ipMoves is what the leader last saw of the BGP next hops.
type ipMoves struct {
	// hops are the nodes that announce each Local-policy address over
	// BGP, joined; nil until the first look of a leadership term, which
	// only records them.
	hops map[netip.Addr]string
	// crdPeers are the accepted BGPPeers (the controller's configuration
	// has no peers of its own from them): a node none of them picks does
	// not announce, unless the file's bgp section gives it peers.
	crdPeers []config.PeerRule
}

// peered reports whether node has a BGP peer: every node has the file's,
// and a BGPPeer's nodeSelector picks some.
func (h *Hook) peered(node string) bool {
	if h.conf().BGP != nil {
		return true
	}
	nl := h.nodeLabels(node)
	return slices.ContainsFunc(h.moves.crdPeers, func(p config.PeerRule) bool { return p.PicksNode(nl) })
}

// noteNextHops puts an IPMoved event on the Services of each Local-policy
// address whose BGP next hops changed since the last look; only the leader
// (leader) looks, and a new term starts afresh.
func (h *Hook) noteNextHops(s *providers.State, leader bool) {
	if !leader || h.conf().BGP == nil && len(h.moves.crdPeers) == 0 {
		h.moves.hops = nil
		return
	}
	now, changed := providers.NextHopChanges(s, h.moves.hops, h.peered)
	if h.moves.hops == nil {
		changed = nil
	}
	h.moves.hops = now
	for ip, c := range changed {
		if now[ip] == "" {
			h.moved(h.leaderRec, c.Svcs, corev1.EventTypeWarning, "%s: no node announces it over BGP now (none has a ready local endpoint it may announce it for), it was %s", ip, c.Was)
			continue
		}
		h.moved(h.leaderRec, c.Svcs, corev1.EventTypeNormal, "%s: BGP next hops now %s, were %s", ip, now[ip], nodeList(c.Was))
	}
}

// nodeList spells joined nodes for an event, "none" for none.
func nodeList(nodes string) string {
	if nodes == "" {
		return "none"
	}
	return nodes
}

// moved puts an IPMoved event on each of svcs, recorded by rec (the
// node's, or the leader's).
func (h *Hook) moved(rec record.EventRecorder, svcs []portal.ServiceKey, typ, msg string, args ...any) {
	for _, k := range svcs {
		obj, ok, _ := h.services.GetStore().GetByKey(k.Namespace + "/" + k.Name)
		if !ok {
			continue
		}
		rec.Eventf(obj.(*corev1.Service), typ, providers.ReasonIPMoved, msg, args...)
	}
}
