package alloc

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/ipam"
	"github.com/onehop/onehop/external/metallb"
	"github.com/onehop/onehop/portal"
)

// The annotations and the load-balancer class onehop understands.
const (
	// LoadBalancerClass marks Services whose LoadBalancer IPs onehop hands out.
	LoadBalancerClass = "onehop.io/lb"
	// AnnotationLoadBalancerIPs requests addresses: "192.0.2.7" or
	// "192.0.2.7,2001:db8::7" (one per family).
	AnnotationLoadBalancerIPs = "onehop.io/load-balancer-ips"
	// AnnotationAddressPool names the pool to allocate from.
	AnnotationAddressPool = "onehop.io/address-pool"
	// AnnotationAllowSharedIP is a sharing key: Services with the same key
	// may share an IP when their ports don't collide, they are in one
	// namespace (unless the pool shares across namespaces) and their
	// traffic policies agree (Local ones selecting the same pods).
	AnnotationAllowSharedIP = "onehop.io/allow-shared-ip"
	// AnnotationExternalIP on a Pod gives it its own external IP.
	AnnotationExternalIP = "onehop.io/external-ip"
)

// metalLBAliases are MetalLB's Service annotations (the current metallb.io
// spelling first, then the older metallb.universe.tf one) that mean what
// onehop's own do, so that Services move over from MetalLB unchanged.
var metalLBAliases = map[string][]string{
	AnnotationLoadBalancerIPs: metallb.LoadBalancerIPsAnnotations,
	AnnotationAddressPool:     metallb.AddressPoolAnnotations,
	AnnotationAllowSharedIP:   metallb.AllowSharedIPAnnotations,
}

// annotation is the key and value of onehop's annotation name on svc, or
// else of the first of its MetalLB aliases that is set.
func annotation(svc *corev1.Service, name string) (key, value string, ok bool) {
	for _, k := range append([]string{name}, metalLBAliases[name]...) {
		if v, set := svc.Annotations[k]; set {
			return k, v, true
		}
	}
	return "", "", false
}

// overriddenAliases says, one sentence each and meant for an event, which
// MetalLB annotations on svc are ignored because they disagree with the
// one used: onehop's own or, without it, the first alias set.
func overriddenAliases(svc *corev1.Service) []string {
	var out []string
	for _, name := range []string{AnnotationLoadBalancerIPs, AnnotationAddressPool, AnnotationAllowSharedIP} {
		usedKey, used, ok := annotation(svc, name)
		if !ok {
			continue
		}
		for _, alias := range metalLBAliases[name] {
			v, set := svc.Annotations[alias]
			if !set || alias == usedKey || normalAnnotation(v) == normalAnnotation(used) {
				continue
			}
			out = append(out, fmt.Sprintf("annotation %s=%q is ignored: %s=%q wins", alias, v, usedKey, used))
		}
	}
	return out
}

// normalAnnotation is an annotation value as it is read: comma-separated
// items, each trimmed, empty ones dropped.
func normalAnnotation(v string) string {
	var items []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			items = append(items, s)
		}
	}
	return strings.Join(items, ",")
}

// Managed reports whether onehop allocates the LoadBalancer IPs of svc
// under p. A Service being deleted still is: every node serves it until it
// is gone from the API, as kube-proxy does, so it holds its addresses
// until then.
func Managed(p *config.Parsed, svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if svc.Spec.LoadBalancerClass == nil {
		return !p.ClasslessIgnored
	}
	return *svc.Spec.LoadBalancerClass == LoadBalancerClass
}

// KeyOf is svc's namespace and name.
func KeyOf(svc *corev1.Service) portal.ServiceKey {
	return portal.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
}

// RequestFor turns a Service into an allocation request; errors name the
// offending field and are meant for an event.
func RequestFor(svc *corev1.Service) (ipam.Request, error) {
	_, pool, _ := annotation(svc, AnnotationAddressPool)
	_, sharingKey, _ := annotation(svc, AnnotationAllowSharedIP)
	req := ipam.Request{
		Service:    KeyOf(svc),
		Pool:       strings.TrimSpace(pool),
		SharingKey: strings.TrimSpace(sharingKey),
		RequireAll: svc.Spec.IPFamilyPolicy != nil && *svc.Spec.IPFamilyPolicy == corev1.IPFamilyPolicyRequireDualStack,
		Labels:     svc.Labels,
		Local:      svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
	}
	if len(svc.Spec.Selector) > 0 {
		req.Selector = labels.SelectorFromSet(svc.Spec.Selector).String()
	}
	for _, f := range svc.Spec.IPFamilies {
		if f == corev1.IPv6Protocol {
			req.Families = append(req.Families, portal.IPv6)
		} else {
			req.Families = append(req.Families, portal.IPv4)
		}
	}
	for _, sp := range svc.Spec.Ports {
		proto, ok := portal.ParseProtocol(string(sp.Protocol))
		if !ok {
			proto = portal.TCP
		}
		req.Ports = append(req.Ports, ipam.Port{Protocol: proto, Port: uint16(sp.Port)})
	}
	if key, v, ok := annotation(svc, AnnotationLoadBalancerIPs); ok {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			a, err := netip.ParseAddr(s)
			if err != nil {
				return req, fmt.Errorf("annotation %s: %q is not an IP address", key, s)
			}
			req.Requested = append(req.Requested, a.Unmap())
		}
		if len(req.Requested) == 0 {
			return req, fmt.Errorf("annotation %s is empty", key)
		}
	} else if s := strings.TrimSpace(svc.Spec.LoadBalancerIP); s != "" {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return req, fmt.Errorf("spec.loadBalancerIP: %q is not an IP address", s)
		}
		req.Requested = []netip.Addr{a.Unmap()}
	}
	return req, nil
}

// StatusIPs are the IPs in svc's status.loadBalancer.ingress.
func StatusIPs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}
