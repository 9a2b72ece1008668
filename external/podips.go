package external

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/portal"
)

// PodExternalIP maps an external IP 1:1 to one pod: inbound traffic to IP is
// DNATed to PodIP (source kept), the pod's outbound traffic is SNATed to IP.
type PodExternalIP struct {
	IP       netip.Addr
	PodIP    netip.Addr
	Pod      portal.ServiceKey // the Pod's namespace/name
	NodeName string
}

// PodRefusal explains why a Pod's onehop.io/external-ip is not honoured.
type PodRefusal struct {
	Pod    *corev1.Pod
	Reason string
	Msg    string
}

// PodExternalIPs maps Pods carrying onehop.io/external-ip to their external
// IPs. allowed says whether an address may be used (ExternalIPCIDRs or a
// pool marked for pods). Two Pods claiming one IP: the older (then the
// lexically first) keeps it, the other is refused. A Pod that is not
// running on a node with a pod IP of the external IP's family yet holds its
// claim but is not mapped. Terminal and deleting Pods claim nothing. The
// result is sorted by IP.
func PodExternalIPs(pods []*corev1.Pod, allowed func(netip.Addr) bool) ([]PodExternalIP, []PodRefusal) {
	var refusals []PodRefusal
	claims := map[netip.Addr][]*corev1.Pod{}
	for _, p := range pods {
		v, ok := p.Annotations[AnnotationExternalIP]
		if !ok || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip, err := netip.ParseAddr(strings.TrimSpace(v))
		if err != nil {
			refusals = append(refusals, PodRefusal{p, "BadAnnotation", fmt.Sprintf("annotation %s: %q is not an IP address", AnnotationExternalIP, v)})
			continue
		}
		ip = ip.Unmap()
		if !allowed(ip) {
			refusals = append(refusals, PodRefusal{p, "ExternalIPNotAllowed", fmt.Sprintf("%s is outside the allowed external IP CIDRs and the pools marked for pods", ip)})
			continue
		}
		claims[ip] = append(claims[ip], p)
	}
	var out []PodExternalIP
	for ip, ps := range claims {
		slices.SortFunc(ps, func(a, b *corev1.Pod) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
		})
		win := ps[0]
		for _, loser := range ps[1:] {
			refusals = append(refusals, PodRefusal{loser, "ExternalIPConflict", fmt.Sprintf("%s is already claimed by the older pod %s/%s", ip, win.Namespace, win.Name)})
		}
		if win.Spec.NodeName == "" {
			continue
		}
		for _, pip := range win.Status.PodIPs {
			a, err := netip.ParseAddr(pip.IP)
			if err == nil && a.Unmap().Is4() == ip.Is4() {
				out = append(out, PodExternalIP{IP: ip, PodIP: a.Unmap(), Pod: portal.ServiceKey{Namespace: win.Namespace, Name: win.Name}, NodeName: win.Spec.NodeName})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b PodExternalIP) int { return a.IP.Compare(b.IP) })
	return out, refusals
}
