package portal

import "net/netip"

// Config is what the model needs to know about this node and the cluster.
type Config struct {
	// NodeName is this node's name, to tell local endpoints from others.
	NodeName string
	// ServiceCIDRs are the cluster-IP ranges; endpoints inside them are refused.
	ServiceCIDRs []netip.Prefix
	// ExternalIPCIDRs allow spec.externalIPs; empty allows none
	// (deny by default, CVE-2020-8554).
	ExternalIPCIDRs []netip.Prefix
	// NodePortCIDRs select the node addresses NodePorts are served on;
	// empty means the node's primary address of each family.
	NodePortCIDRs []netip.Prefix
	// ServiceProxyName, when set, makes onehop serve only Services labelled
	// service.kubernetes.io/service-proxy-name with this value.
	ServiceProxyName string
	// NodeIPs are this node's primary address of each family (its Node's
	// first InternalIP, else ExternalIP, as kube-proxy picks them): a
	// Service whose loadBalancerSourceRanges hold one also lets in
	// packets from its own load-balancer IPs. The Tracker keeps them
	// from the Node object.
	NodeIPs []netip.Addr
	// NodeZone is this node's topology.kubernetes.io/zone, for topology hints.
	NodeZone string
	// Limits bound one Service's contribution to the ruleset; zero fields
	// take DefaultLimits.
	Limits Limits
	// Balancing is the default of Services without the
	// onehop.io/balancing annotation.
	Balancing Balancing
}

// The labels and annotations the model reads.
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
	LabelServiceName      = "kubernetes.io/service-name"
	AnnotationScheduler   = "onehop.io/scheduler"
)

// ipvsSchedulers are the scheduler names IPVS knows.
var ipvsSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos"}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
