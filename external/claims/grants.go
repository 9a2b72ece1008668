package external

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"

	"github.com/onehop/onehop/portal"
)

// GrantsConfigMapName is the ConfigMap, in the lease namespace, in which
// the controller of a split install records which Pod holds each pod
// external IP, and which namespace's Services hold each spec.externalIPs
// address. Only the controller writes it; node agents read it and map a
// Pod of their own node only when it names that Pod, and serve an
// external IP for the namespace it names.
const GrantsConfigMapName = "onehop-pod-external-ips"

// The ConfigMap keys holding the grants as JSON: the Pods' (grant) and
// the Services' (externalGrant).
const (
	grantsKey   = "grants"
	externalKey = "externalIPs"
)

// grant is one pod external IP and the Pod holding it.
type grant struct {
	IP        netip.Addr `json:"ip"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	UID       types.UID  `json:"uid"`
}

// externalGrant is one spec.externalIPs address and the namespace whose
// Services hold it.
type externalGrant struct {
	IP        netip.Addr `json:"ip"`
	Namespace string     `json:"namespace"`
}

// settles reports whether the controller settles who holds external
// addresses: a split install with pod external IPs on or externalIPCIDRs
// set. Node agents then follow the controller's grants (and, for pod
// external IPs, watch only their own node's Pods); without a separate
// controller every agent settles them itself.
func (p *parsed) settles() bool {
	return p.SeparateController && (p.PodExternalIPs || len(p.extCIDR) > 0)
}

// decodeGrants reads the grants of cm (none for nil). A grant that does not
// parse is left out: its Pod is not mapped, nobody else takes its address
// on this node either (the controller writes what it reads back).
func decodeGrants(cm *corev1.ConfigMap) ([]grant, error) {
	if cm == nil || cm.Data[grantsKey] == "" {
		return nil, nil
	}
	var gs []grant
	if err := json.Unmarshal([]byte(cm.Data[grantsKey]), &gs); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return gs, nil
}

func encodeGrants(gs []grant) string {
	slices.SortFunc(gs, func(a, b grant) int { return a.IP.Compare(b.IP) })
	b, _ := json.Marshal(gs) // netip.Addr and strings: cannot fail
	return string(b)
}

// decodeExternalGrants reads the spec.externalIPs grants of cm (none for
// nil), as the registry takes them: address -> namespace. A ConfigMap that
// does not parse grants nothing: every agent then falls back alike to the
// oldest claim.
func decodeExternalGrants(cm *corev1.ConfigMap) (map[netip.Addr]string, error) {
	if cm == nil || cm.Data[externalKey] == "" {
		return nil, nil
	}
	var gs []externalGrant
	if err := json.Unmarshal([]byte(cm.Data[externalKey]), &gs); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s, key %s: %w", cm.Namespace, cm.Name, externalKey, err)
	}
	out := map[netip.Addr]string{}
	for _, g := range gs {
		if g.IP.IsValid() && g.Namespace != "" {
			out[g.IP.Unmap()] = g.Namespace
		}
	}
	return out, nil
}

// externalGrantsOf are the spec.externalIPs addresses own gives to a
// namespace's Services, encoded, sorted by address.
func externalGrantsOf(own *ownership) string {
	gs := []externalGrant{}
	for ip, h := range own.held {
		if h.kind == heldByExternalIP {
			gs = append(gs, externalGrant{IP: ip, Namespace: h.namespace})
		}
	}
	slices.SortFunc(gs, func(a, b externalGrant) int { return a.IP.Compare(b.IP) })
	b, _ := json.Marshal(gs) // netip.Addr and strings: cannot fail
	return string(b)
}

// grantsOf are the pod external IPs own gives to Pods, with the Pods' UIDs
// from pods (a holder not among them is left out).
func grantsOf(own *ownership, pods []*corev1.Pod) []grant {
	uid := map[portal.ServiceKey]types.UID{}
	for _, p := range pods {
		uid[portal.ServiceKey{Namespace: p.Namespace, Name: p.Name}] = p.UID
	}
	gs := []grant{}
	for ip, h := range own.held {
		if h.kind != heldByPod {
			continue
		}
		if u, ok := uid[h.pod]; ok {
			gs = append(gs, grant{IP: ip, Namespace: h.pod.Namespace, Name: h.pod.Name, UID: u})
		}
	}
	return gs
}

// settledPods is what a node agent's registry reads of Pods when the
// controller settles them: its own node's Pods that hold a grant for the
// address they claim, and, for every other grant, a stand-in Pod that
// holds the address (no node, so nothing maps it here) so that no
// Service's spec.externalIPs takes it on this node. A local Pod whose
// claim differs from its grant maps nothing until the controller says.
func settledPods(local []*corev1.Pod, gs []grant) []*corev1.Pod {
	byUID := map[types.UID]grant{}
	for _, g := range gs {
		byUID[g.UID] = g
	}
	var out []*corev1.Pod
	taken := map[types.UID]bool{}
	for _, p := range local {
		g, ok := byUID[p.UID]
		if !ok || g.Namespace != p.Namespace || g.Name != p.Name {
			continue
		}
		if a, err := netip.ParseAddr(strings.TrimSpace(p.Annotations[AnnotationExternalIP])); err != nil || a.Unmap() != g.IP {
			continue
		}
		out = append(out, p)
		taken[p.UID] = true
	}
	for _, g := range gs {
		if taken[g.UID] || !g.IP.IsValid() {
			continue
		}
		out = append(out, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: g.Namespace, Name: g.Name, UID: g.UID,
			Annotations: map[string]string{AnnotationExternalIP: g.IP.String()}}})
	}
	return out
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
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", GrantsConfigMapName).String()
		}))
	h.grants = h.grantFactory.Core().V1().ConfigMaps().Informer()
}

// currentGrants are the grants a node agent follows now.
func (h *Hook) currentGrants() []grant {
	cm := h.grantsConfigMap()
	gs, err := decodeGrants(cm)
	if err != nil {
		h.log.Error("external: pod external IP grants unreadable; mapping none", "err", err)
		return nil
	}
	return gs
}

// grantsConfigMap is the grants ConfigMap as a node agent sees it now
// (nil when there is none).
func (h *Hook) grantsConfigMap() *corev1.ConfigMap {
	obj, ok, _ := h.grants.GetStore().GetByKey(h.conf().LeaseNamespace + "/" + GrantsConfigMapName)
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
	gs, err := decodeExternalGrants(cm)
	if err != nil {
		h.log.Error("external: external IP grants unreadable; the oldest claim holds each address", "err", err)
	}
	return gs
}

// seedGrants starts a new leader's registry from the grants its
// predecessor recorded, so that a Pod holding an address keeps it across
// a change of controller (on a fresh start the oldest claimant would win).
func (h *Hook) seedGrants(ctx context.Context) {
	cm, err := h.client.CoreV1().ConfigMaps(h.conf().LeaseNamespace).Get(ctx, GrantsConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		h.log.Warn("external: reading the pod external IP grants; the oldest claimant wins ties this once", "err", err)
		return
	}
	gs, err := decodeGrants(cm)
	if err != nil {
		h.log.Warn("external: pod external IP grants unreadable; writing them afresh", "err", err)
		return
	}
	h.regMu.Lock()
	h.registry.seed(gs)
	h.granted = cm
	h.regMu.Unlock()
}

// publishGrants writes the registry's latest pod external IP holders to
// the grants ConfigMap when they changed (the leading controller of a
// split install). An error is tried again by the caller.
func (h *Hook) publishGrants(ctx context.Context) error {
	h.mu.Lock()
	leader := h.leader
	h.mu.Unlock()
	if !leader {
		return nil
	}
	var pods []*corev1.Pod
	if h.pods != nil {
		for _, o := range h.pods.GetStore().List() {
			pods = append(pods, o.(*corev1.Pod))
		}
	}
	h.regMu.Lock()
	own, prev := h.own, h.granted
	h.regMu.Unlock()
	if own == nil {
		return nil
	}
	data, external := encodeGrants(grantsOf(own, pods)), externalGrantsOf(own)
	if prev != nil && prev.Data[grantsKey] == data && prev.Data[externalKey] == external {
		return nil
	}
	cms := h.client.CoreV1().ConfigMaps(h.conf().LeaseNamespace)
	var cm *corev1.ConfigMap
	var err error
	if prev == nil {
		cm, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: GrantsConfigMapName, Namespace: h.conf().LeaseNamespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "onehop"}},
			Data:       map[string]string{grantsKey: data, externalKey: external},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cm, err = cms.Get(ctx, GrantsConfigMapName, metav1.GetOptions{})
			if err == nil {
				h.setGranted(cm)
				return fmt.Errorf("grants ConfigMap appeared meanwhile; writing it again")
			}
		}
	} else {
		next := prev.DeepCopy()
		if next.Data == nil {
			next.Data = map[string]string{}
		}
		next.Data[grantsKey], next.Data[externalKey] = data, external
		cm, err = cms.Update(ctx, next, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			h.setGranted(nil)
			if cur, gerr := cms.Get(ctx, GrantsConfigMapName, metav1.GetOptions{}); gerr == nil {
				h.setGranted(cur)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("writing the external IP grants: %w", err)
	}
	h.setGranted(cm)
	return nil
}

func (h *Hook) setGranted(cm *corev1.ConfigMap) {
	h.regMu.Lock()
	h.granted = cm
	h.regMu.Unlock()
}
