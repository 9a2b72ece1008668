package netns

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// No controller-manager runs in the namespace cluster. The functions here
// stand in for the two controllers the agent depends on, writing exactly what
// they write: the EndpointSlice controller (one slice per address family,
// generateName "<service>-", labels kubernetes.io/service-name and
// endpointslice.kubernetes.io/managed-by, an owner reference to the Service,
// ready/serving/terminating conditions, nodeName, zone, a Pod targetRef) and
// the garbage collector (slices go when their Service goes).

// ManagedBy is the managed-by label value of the EndpointSlice controller.
const ManagedBy = "endpointslice-controller.k8s.io"

// Endpoint is one pod backing a Service, with its conditions.
type Endpoint struct {
	Pod *Pod
	// NotReady marks the pod not ready (readiness probe failing).
	NotReady bool
	// Terminating marks the pod as being deleted; Serving says whether it
	// still passes readiness while terminating.
	Terminating bool
	Serving     bool
}

// Ready returns ready endpoints for pods.
func Ready(pods ...*Pod) []Endpoint {
	out := make([]Endpoint, 0, len(pods))
	for _, p := range pods {
		out = append(out, Endpoint{Pod: p})
	}
	return out
}

func (e Endpoint) conditions() discoveryv1.EndpointConditions {
	switch {
	case e.Terminating:
		return discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(e.Serving), Terminating: ptr.To(true)}
	case e.NotReady:
		return discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	default:
		return discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	}
}

// CreateService creates svc (namespace "default" when unset).
func (c *Cluster) CreateService(ctx context.Context, svc *v1.Service) (*v1.Service, error) {
	if svc.Namespace == "" {
		svc.Namespace = metav1.NamespaceDefault
	}
	return c.Client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
}

// SetEndpoints writes the EndpointSlices of svc to hold eps, one slice per
// IP family of the Service, creating them or updating them in place, as the
// EndpointSlice controller does.
func (c *Cluster) SetEndpoints(ctx context.Context, svc *v1.Service, eps []Endpoint) error {
	slices := c.Client.DiscoveryV1().EndpointSlices(svc.Namespace)
	existing, err := slices.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name})
	if err != nil {
		return err
	}
	families := svc.Spec.IPFamilies
	if len(families) == 0 {
		families = []v1.IPFamily{v1.IPv4Protocol}
	}
next:
	for _, family := range families {
		want := endpointSlice(svc, family, eps)
		for _, s := range existing.Items {
			if s.AddressType == want.AddressType && s.Labels[discoveryv1.LabelManagedBy] == ManagedBy {
				s.Endpoints, s.Ports = want.Endpoints, want.Ports
				if _, err := slices.Update(ctx, &s, metav1.UpdateOptions{}); err != nil {
					return err
				}
				continue next
			}
		}
		if _, err := slices.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func endpointSlice(svc *v1.Service, family v1.IPFamily, eps []Endpoint) *discoveryv1.EndpointSlice {
	addressType := discoveryv1.AddressTypeIPv4
	if family == v1.IPv6Protocol {
		addressType = discoveryv1.AddressTypeIPv6
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: svc.Name + "-",
			Namespace:    svc.Namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name,
				discoveryv1.LabelManagedBy:   ManagedBy,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         "v1",
				Kind:               "Service",
				Name:               svc.Name,
				UID:                svc.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		AddressType: addressType,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, p := range svc.Spec.Ports {
		target := int32(p.TargetPort.IntValue())
		if target == 0 {
			target = p.Port
		}
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{
			Name:     ptr.To(p.Name),
			Protocol: ptr.To(p.Protocol),
			Port:     ptr.To(target),
		})
	}
	for _, e := range eps {
		addr := e.Pod.IP
		if family == v1.IPv6Protocol {
			addr = e.Pod.IP6
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr},
			Conditions: e.conditions(),
			NodeName:   ptr.To(e.Pod.Node.Name),
			Zone:       ptr.To(e.Pod.Node.Zone),
			TargetRef: &v1.ObjectReference{
				Kind:      "Pod",
				Namespace: svc.Namespace,
				Name:      e.Pod.Name,
				UID:       types.UID(fmt.Sprintf("pod-%s", e.Pod.Name)),
			},
		})
	}
	return s
}

// DeleteService deletes a Service and, as the garbage collector would, its
// EndpointSlices.
func (c *Cluster) DeleteService(ctx context.Context, namespace, name string) error {
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	err := c.Client.CoreV1().Services(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return c.Client.DiscoveryV1().EndpointSlices(namespace).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
}

// SetLoadBalancerIngress writes status.loadBalancer.ingress as a cloud
// provider's service controller would.
func (c *Cluster) SetLoadBalancerIngress(ctx context.Context, svc *v1.Service, ips ...string) (*v1.Service, error) {
	cur, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	cur.Status.LoadBalancer.Ingress = nil
	for _, ip := range ips {
		cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(v1.LoadBalancerIPModeVIP)})
	}
	return c.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
}
