package claims

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
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/onehop/onehop/portal"
)

// GrantsConfigMapName is the ConfigMap, in the lease namespace, in which
// the controller of a split install records which Pod holds each pod
// external IP, and which namespace's Services hold each spec.externalIPs
// address. Only the controller writes it; node agents read it and map a
// Pod of their own node only when it names that Pod, and serve an
// external IP for the namespace it names.
const GrantsConfigMapName = "onehop-pod-external-ips"

// The ConfigMap keys holding the grants as JSON: the Pods' (Grant) and
// the Services' (externalGrant).
const (
	GrantsKey         = "grants"
	ExternalGrantsKey = "externalIPs"
)

// Grant is one pod external IP and the Pod holding it.
type Grant struct {
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

// DecodeGrants reads the grants of cm (none for nil). A grant that does not
// parse is left out: its Pod is not mapped, nobody else takes its address
// on this node either (the controller writes what it reads back).
func DecodeGrants(cm *corev1.ConfigMap) ([]Grant, error) {
	if cm == nil || cm.Data[GrantsKey] == "" {
		return nil, nil
	}
	var gs []Grant
	if err := json.Unmarshal([]byte(cm.Data[GrantsKey]), &gs); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return gs, nil
}

func EncodeGrants(gs []Grant) string {
	slices.SortFunc(gs, func(a, b Grant) int { return a.IP.Compare(b.IP) })
	b, _ := json.Marshal(gs) // netip.Addr and strings: cannot fail
	return string(b)
}

// DecodeExternalGrants reads the spec.externalIPs grants of cm (none for
// nil), as the registry takes them: address -> namespace. A ConfigMap that
// does not parse grants nothing: every agent then falls back alike to the
// oldest claim.
func DecodeExternalGrants(cm *corev1.ConfigMap) (map[netip.Addr]string, error) {
	if cm == nil || cm.Data[ExternalGrantsKey] == "" {
		return nil, nil
	}
	var gs []externalGrant
	if err := json.Unmarshal([]byte(cm.Data[ExternalGrantsKey]), &gs); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s, key %s: %w", cm.Namespace, cm.Name, ExternalGrantsKey, err)
	}
	out := map[netip.Addr]string{}
	for _, g := range gs {
		if g.IP.IsValid() && g.Namespace != "" {
			out[g.IP.Unmap()] = g.Namespace
		}
	}
	return out, nil
}

// ExternalGrantsOf are the spec.externalIPs addresses own gives to a
// namespace's Services, encoded, sorted by address.
func ExternalGrantsOf(own *Ownership) string {
	gs := []externalGrant{}
	for ip, h := range own.Held {
		if h.Kind == HeldByExternalIP {
			gs = append(gs, externalGrant{IP: ip, Namespace: h.Namespace})
		}
	}
	slices.SortFunc(gs, func(a, b externalGrant) int { return a.IP.Compare(b.IP) })
	b, _ := json.Marshal(gs) // netip.Addr and strings: cannot fail
	return string(b)
}

// GrantsOf are the pod external IPs own gives to Pods, with the Pods' UIDs
// from pods (a holder not among them is left out).
func GrantsOf(own *Ownership, pods []*corev1.Pod) []Grant {
	uid := map[portal.ServiceKey]types.UID{}
	for _, p := range pods {
		uid[portal.ServiceKey{Namespace: p.Namespace, Name: p.Name}] = p.UID
	}
	gs := []Grant{}
	for ip, h := range own.Held {
		if h.Kind != HeldByPod {
			continue
		}
		if u, ok := uid[h.Pod]; ok {
			gs = append(gs, Grant{IP: ip, Namespace: h.Pod.Namespace, Name: h.Pod.Name, UID: u})
		}
	}
	return gs
}

// SettledPods is what a node agent's registry reads of Pods when the
// controller settles them: its own node's Pods that hold a grant for the
// address they claim, and, for every other grant, a stand-in Pod that
// holds the address (no node, so nothing maps it here) so that no
// Service's spec.externalIPs takes it on this node. A local Pod whose
// claim differs from its grant maps nothing until the controller says.
func SettledPods(local []*corev1.Pod, gs []Grant) []*corev1.Pod {
	byUID := map[types.UID]Grant{}
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

// Publish writes own's holders (the Pods' UIDs from pods) to the grants
// ConfigMap of namespace, through cms, when they differ from prev: the
// ConfigMap as last written or read (nil: none). set is told each
// ConfigMap learnt to be the one in the API now (nil: none known), which
// the next Publish is given as prev. An error is tried again by the
// caller.
func Publish(ctx context.Context, cms typedcorev1.ConfigMapInterface, namespace string, own *Ownership, pods []*corev1.Pod,
	prev *corev1.ConfigMap, set func(*corev1.ConfigMap)) error {
	data, external := EncodeGrants(GrantsOf(own, pods)), ExternalGrantsOf(own)
	if prev != nil && prev.Data[GrantsKey] == data && prev.Data[ExternalGrantsKey] == external {
		return nil
	}
	var cm *corev1.ConfigMap
	var err error
	if prev == nil {
		cm, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: GrantsConfigMapName, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "onehop"}},
			Data:       map[string]string{GrantsKey: data, ExternalGrantsKey: external},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cm, err = cms.Get(ctx, GrantsConfigMapName, metav1.GetOptions{})
			if err == nil {
				set(cm)
				return fmt.Errorf("grants ConfigMap appeared meanwhile; writing it again")
			}
		}
	} else {
		next := prev.DeepCopy()
		if next.Data == nil {
			next.Data = map[string]string{}
		}
		next.Data[GrantsKey], next.Data[ExternalGrantsKey] = data, external
		cm, err = cms.Update(ctx, next, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			set(nil)
			if cur, gerr := cms.Get(ctx, GrantsConfigMapName, metav1.GetOptions{}); gerr == nil {
				set(cur)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("writing the external IP grants: %w", err)
	}
	set(cm)
	return nil
}
