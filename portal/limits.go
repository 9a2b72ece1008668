package portal

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Limits bound what one Service may put into every node's ruleset: its
// ports, its source ranges, and its external and load-balancer IPs. Each
// costs rules, chains or set elements on every node, and one Service's
// author chooses them. A Service over a limit is refused whole, with a
// ServiceTooLarge event, and served nowhere until it fits; every other
// Service syncs as before. Zero fields take the default.
//
// Refused whole rather than trimmed: a Service with some ports dropped, or
// some source ranges (which lets in fewer clients than asked for, or, were
// the ranges dropped altogether, every client), behaves in a way its
// author cannot see from the object; refused, it is plainly not served,
// the same on every node, and the event says why. This is the apiserver's
// own way with an object that fails validation.
type Limits struct {
	// Ports is the most spec.ports entries.
	Ports int
	// SourceRanges is the most spec.loadBalancerSourceRanges entries of a
	// LoadBalancer Service.
	SourceRanges int
	// ExternalIPs is the most spec.externalIPs entries.
	ExternalIPs int
	// LoadBalancerIPs is the most status.loadBalancer.ingress entries of a
	// LoadBalancer Service.
	LoadBalancerIPs int
}

// DefaultLimits are generous for real use. Ports: a NodePort or
// LoadBalancer Service cannot have more than the 2,768 node ports of the
// default range, and the largest Services seen in the field (media servers
// listing an RTP range port by port) have a few thousand. Source ranges:
// cloud load balancers stop at hundreds (AWS at 1,000 security-group rules
// per interface); nftables keeps them in one set per Service, so 10,000
// cost two set elements each and no rule. External and load-balancer IPs:
// a Service has one or two per family; a hundred leaves room for unusual
// setups while bounding ports x addresses.
var DefaultLimits = Limits{Ports: 5000, SourceRanges: 10000, ExternalIPs: 100, LoadBalancerIPs: 100}

// orDefault fills the zero fields of l from DefaultLimits.
func (l Limits) orDefault() Limits {
	pick := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	d := DefaultLimits
	return Limits{
		Ports:           pick(l.Ports, d.Ports),
		SourceRanges:    pick(l.SourceRanges, d.SourceRanges),
		ExternalIPs:     pick(l.ExternalIPs, d.ExternalIPs),
		LoadBalancerIPs: pick(l.LoadBalancerIPs, d.LoadBalancerIPs),
	}
}

// overLimits returns the Problem refusing svc when it is over a limit, nil
// when it fits. Entries are counted as listed, before bad ones are left out.
func (c *Config) overLimits(svc *v1.Service) *Problem {
	l := c.Limits.orDefault()
	lb := svc.Spec.Type == v1.ServiceTypeLoadBalancer
	var over []string
	check := func(n, limit int, what, field string) {
		if n > limit {
			over = append(over, fmt.Sprintf("%d %s (at most %d, serviceLimits.%s)", n, what, limit, field))
		}
	}
	check(len(svc.Spec.Ports), l.Ports, "ports", "ports")
	if lb {
		check(len(svc.Spec.LoadBalancerSourceRanges), l.SourceRanges, "loadBalancerSourceRanges", "sourceRanges")
		check(len(svc.Status.LoadBalancer.Ingress), l.LoadBalancerIPs, "load-balancer ingress IPs", "loadBalancerIPs")
	}
	check(len(svc.Spec.ExternalIPs), l.ExternalIPs, "externalIPs", "externalIPs")
	if len(over) == 0 {
		return nil
	}
	return &Problem{Service: ServiceKey{Namespace: svc.Namespace, Name: svc.Name}, Reason: ReasonTooLarge, Message: fmt.Sprintf(
		"the Service has %s; it is not served until it fits (the limits are onehop's OnehopConfiguration serviceLimits)",
		strings.Join(over, ", "))}
}
