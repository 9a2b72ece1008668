package providers

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/ipam"
	"github.com/onehop/onehop/portal"
)

// Target is one external IP and the nodes that should receive its traffic.
type Target struct {
	IP netip.Addr
	// Service owns the IP; for a pod external IP it names the Pod.
	Service portal.ServiceKey
	// Pod is true for a pod external IP.
	Pod   bool
	Ports []ipam.Port
	// Local is externalTrafficPolicy: Local: only nodes with a ready local
	// endpoint serve.
	Local               bool
	HealthCheckNodePort uint16
	// Nodes should receive the IP's traffic, sorted by name. Targets
	// share it (read it, never change it).
	Nodes []string
}

// The taint and label that take a node out of load-balancer rotation, as in
// Kubernetes' service controller.
const (
	taintToBeDeleted   = "ToBeDeletedByClusterAutoscaler"
	labelExcludeFromLB = "node.kubernetes.io/exclude-from-external-load-balancers"
)

// NodeEligible reports whether n may receive external traffic under the
// Cluster policy: Ready, schedulable, not being deleted, not tainted for
// deletion by the cluster autoscaler, not labelled out of load balancers.
func NodeEligible(n *corev1.Node) bool {
	if !nodeAlive(n) || n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Key == taintToBeDeleted {
			return false
		}
	}
	return true
}

// nodeAlive: the weaker test for the Local policy, where a cordoned node
// still serves its own pods.
func nodeAlive(n *corev1.Node) bool {
	if n == nil || n.DeletionTimestamp != nil {
		return false
	}
	if _, ok := n.Labels[labelExcludeFromLB]; ok {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TargetInput is the cluster state Targets reads.
type TargetInput struct {
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	Nodes    []*corev1.Node
	// Own says who rightfully holds each address (claims.Registry).
	Own *claims.Ownership
}

// targets computes, for every external IP onehop is responsible for, the
// nodes that should receive it, for its rightful holders only (the
// registry's answer): load-balancer IPs of managed Services, spec.externalIPs
// that are allowed and not held by someone else, and pod external IPs. A
// Service that merely names an address another holds gets no target for it.
func targets(in TargetInput) []Target {
	out, _ := Targets(in)
	return out
}

// Targets is targets, and the nodes eligible under the Cluster policy
// (sorted), which the Nodes of every Cluster-policy target share: one
// slice, not one copy per IP.
func Targets(in TargetInput) ([]Target, []string) {
	nodes := map[string]*corev1.Node{}
	var cluster []string
	for _, n := range in.Nodes {
		nodes[n.Name] = n
		if NodeEligible(n) {
			cluster = append(cluster, n.Name)
		}
	}
	slices.Sort(cluster)
	// Ready endpoints' nodes per Service.
	ready := map[portal.ServiceKey]map[string]bool{}
	for _, es := range in.Slices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		k := portal.ServiceKey{Namespace: es.Namespace, Name: name}
		for _, ep := range es.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			m := ready[k]
			if m == nil {
				m = map[string]bool{}
				ready[k] = m
			}
			node := ""
			if ep.NodeName != nil {
				node = *ep.NodeName
			}
			m[node] = true
		}
	}
	var out []Target
	for _, svc := range in.Services {
		k := alloc.KeyOf(svc) // one being deleted is served, and so announced, until it is gone
		ips := append(slices.Clone(in.Own.LB[k]), in.Own.External[k]...)
		if len(ips) == 0 {
			continue
		}
		local := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
		var serving []string
		switch {
		case len(ready[k]) == 0:
			// no endpoint: no node can serve
		case local:
			for n := range ready[k] {
				if nodeAlive(nodes[n]) {
					serving = append(serving, n)
				}
			}
			slices.Sort(serving)
		default:
			serving = cluster
		}
		req, _ := alloc.RequestFor(svc)
		slices.SortFunc(ips, netip.Addr.Compare)
		ips = slices.Compact(ips)
		for _, ip := range ips {
			out = append(out, Target{
				IP: ip, Service: k, Ports: req.Ports, Local: local,
				HealthCheckNodePort: uint16(svc.Spec.HealthCheckNodePort),
				Nodes:               serving,
			})
		}
	}
	for _, pe := range in.Own.Pods {
		var ns []string
		if nodeAlive(nodes[pe.NodeName]) {
			ns = []string{pe.NodeName}
		}
		out = append(out, Target{IP: pe.IP, Service: pe.Pod, Pod: true, Nodes: ns})
	}
	slices.SortFunc(out, func(a, b Target) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		return claims.CompareKeys(a.Service, b.Service)
	})
	return out, cluster
}
