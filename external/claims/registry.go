package external

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/onehop/onehop/external/ipam"
	"github.com/onehop/onehop/portal"
)

// The event reasons of refused claims on external addresses.
const (
	// ReasonExternalIPNotAllowed: outside externalIPCIDRs (and, for Pods,
	// the pools with allowPods), in a pool that does not serve the Pod's
	// namespace or selects Services by label, or claimed by a hostNetwork
	// Pod.
	ReasonExternalIPNotAllowed = "ExternalIPNotAllowed"
	// ReasonExternalIPConflict: someone else holds the address.
	ReasonExternalIPConflict = "ExternalIPConflict"
	// ReasonBadAnnotation: an annotation that does not parse.
	ReasonBadAnnotation = "BadAnnotation"
)

// holderKind is who holds an address, strongest first: a claim never
// takes an address from a stronger kind.
type holderKind uint8

const (
	heldByNode         holderKind = iota // a node's own address
	heldByClusterIP                      // a Service's cluster IP
	heldByLoadBalancer                   // an LB allocation (Service status, written by the allocator)
	heldByForeignLB                      // a load-balancer IP another controller gave a Service
	heldByExternalIP                     // spec.externalIPs of the Services of one namespace
	heldByPod                            // onehop.io/external-ip on one Pod
)

// holding says who holds one address.
type holding struct {
	kind holderKind
	// node names the node (heldByNode).
	node string
	// services hold a cluster, load-balancer or external IP; several
	// share a load-balancer IP (same sharing key) or an external IP (same
	// namespace).
	services []portal.ServiceKey
	// pod holds a pod external IP.
	pod portal.ServiceKey
	// namespace of the holding Services or Pod.
	namespace string
}

// describe names the holder for an event on a claimant of namespace ns;
// holders of other namespaces are not named, so that no tenant learns
// another's names.
func (h *holding) describe(ns string) string {
	switch h.kind {
	case heldByNode:
		return "the address of node " + h.node
	case heldByClusterIP:
		return "a Service's cluster IP"
	case heldByForeignLB:
		return "a Service's load-balancer IP from another controller"
	}
	what := map[holderKind]string{heldByLoadBalancer: "the load-balancer IP of ", heldByExternalIP: "an external IP of ", heldByPod: "the external IP of "}[h.kind]
	if h.namespace != ns {
		if h.kind == heldByPod {
			return what + "a Pod of another namespace"
		}
		return what + "a Service of another namespace"
	}
	if h.kind == heldByPod {
		return what + "Pod " + h.pod.String()
	}
	names := make([]string, len(h.services))
	for i, s := range h.services {
		names[i] = s.String()
	}
	return what + "Service " + strings.Join(names, ", ")
}

// refusal is a claim the registry turned down, for an event on the
// claimant (Service or Pod).
type refusal struct {
	obj    object // *corev1.Service or *corev1.Pod
	ip     string
	reason string
	msg    string
}

// ownership is the registry's answer: who rightfully holds each address.
type ownership struct {
	held map[netip.Addr]*holding
	// lb and external are each Service's rightful load-balancer and
	// external IPs, sorted.
	lb, external map[portal.ServiceKey][]netip.Addr
	// pods are the pod external IPs held, mapped when the Pod runs on a
	// node with a pod IP of the address's family; sorted by IP.
	pods     []PodExternalIP
	refusals []refusal
}

// reserved names who holds ip when that is not a load-balancer allocation
// ("" otherwise): the allocator neither hands out nor keeps such addresses.
func (o *ownership) reserved(ip netip.Addr) string {
	if o == nil {
		return ""
	}
	h := o.held[ip]
	if h == nil || h.kind == heldByLoadBalancer {
		return ""
	}
	return h.describe("")
}

// registryInput is the cluster state the registry reads.
type registryInput struct {
	services []*corev1.Service
	pods     []*corev1.Pod
	nodes    []*corev1.Node
	// settled: the pods hold what the controller granted them
	// (settledPods), so a Pod's claim wins over spec.externalIPs.
	settled bool
	// external are the controller's grants of spec.externalIPs addresses
	// (address -> namespace): that namespace's Services hold the address
	// while they list it.
	external map[netip.Addr]string
}

// registry decides who holds each external address: one holder per address
// (a node, a cluster IP, the Services sharing a load-balancer IP, the
// Services of one namespace listing it in spec.externalIPs, or one Pod). A
// claim on a held address is refused and the holder keeps it. Kinds rank
// as holderKind says. Between spec.externalIPs claims (and between them
// and Pods) the namespace the controller granted the address keeps it
// (registryInput.external); without a grant the oldest object wins. That
// is API state alone, so every agent, restarted or not, gives an address
// to the same Services. Between Pods, the one that held the address last
// time keeps it (last; the controller records it as a grant).
type registry struct {
	cfg *parsed
	// last holds the Pod holders of the previous answer.
	last map[netip.Addr]*holding
}

func newRegistry(cfg *parsed) *registry { return &registry{cfg: cfg} }

// claim is one Service's or Pod's claim on an address.
type claim struct {
	kind    holderKind
	svc     *corev1.Service
	pod     *corev1.Pod
	created metav1.Time
	key     portal.ServiceKey
}

// object is a Service or a Pod, something an event can be put on.
type object interface {
	metav1.Object
	runtime.Object
}

func (c claim) obj() object {
	if c.pod != nil {
		return c.pod
	}
	return c.svc
}

// resolve computes the ownership of every address in in.
func (r *registry) resolve(in registryInput) *ownership {
	o := &ownership{held: map[netip.Addr]*holding{}, lb: map[portal.ServiceKey][]netip.Addr{}, external: map[portal.ServiceKey][]netip.Addr{}}
	refuse := func(c claim, ip, reason, format string, a ...any) {
		o.refusals = append(o.refusals, refusal{obj: c.obj(), ip: ip, reason: reason, msg: fmt.Sprintf(format, a...)})
	}

	// Nodes' addresses and cluster IPs first: nothing takes them.
	for _, n := range in.nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				if _, ok := o.held[ip.Unmap()]; !ok {
					o.held[ip.Unmap()] = &holding{kind: heldByNode, node: n.Name}
				}
			}
		}
	}
	svcs := slices.Clone(in.services)
	slices.SortFunc(svcs, olderFirst)
	for _, svc := range svcs {
		for _, s := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
			if ip, err := netip.ParseAddr(s); err == nil {
				if _, ok := o.held[ip.Unmap()]; !ok {
					o.held[ip.Unmap()] = &holding{kind: heldByClusterIP, services: []portal.ServiceKey{keyOf(svc)}, namespace: svc.Namespace}
				}
			}
		}
	}

	// Load-balancer allocations: what the allocator wrote to the status of
	// managed Services, restored oldest first as a new allocator would.
	if alloc, err := ipam.New(r.cfg.pools); err == nil {
		alloc.Reserved = o.reserved
		for _, svc := range svcs {
			ips := statusIPs(svc)
			if len(ips) == 0 || !r.cfg.managed(svc) {
				continue
			}
			req, _ := requestFor(svc)
			if alloc.Restore(req, ips) != nil {
				continue // the allocator moves it (and says so)
			}
			k := keyOf(svc)
			for _, ip := range alloc.Holds(k) {
				h := o.held[ip]
				if h == nil {
					h = &holding{kind: heldByLoadBalancer, namespace: svc.Namespace}
					o.held[ip] = h
				}
				h.services = append(h.services, k)
				if h.namespace != svc.Namespace {
					h.namespace = "" // shared across namespaces: none of them alone
				}
				o.lb[k] = append(o.lb[k], ip)
			}
		}
	}

	// Load-balancer IPs of other controllers are Service IPs too, and so
	// are those in the status of a Service of ours that no pool holds (set
	// by hand, or before the pools changed): until the allocator moves
	// them they are that Service's, not free for anyone's externalIPs.
	// Here and below, a Service being deleted holds what it held until it
	// is gone: every node serves it until then, as kube-proxy does.
	for _, svc := range svcs {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		for _, ip := range statusIPs(svc) {
			if _, ok := o.held[ip]; !ok {
				o.held[ip] = &holding{kind: heldByForeignLB, services: []portal.ServiceKey{keyOf(svc)}, namespace: svc.Namespace}
			}
		}
	}

	// spec.externalIPs and pod external IPs compete for what is left.
	claims := map[netip.Addr][]claim{}
	for _, svc := range svcs {
		c := claim{kind: heldByExternalIP, svc: svc, created: svc.CreationTimestamp, key: keyOf(svc)}
		seen := map[netip.Addr]bool{}
		for _, s := range svc.Spec.ExternalIPs {
			a, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil || !r.cfg.externalIPAllowed(a) {
				refuse(c, s, ReasonExternalIPNotAllowed, "spec.externalIPs %q is outside --external-ip-cidrs; it is not served", s)
				continue
			}
			a = a.Unmap()
			if seen[a] {
				continue
			}
			seen[a] = true
			if h := o.held[a]; h != nil {
				if h.kind != heldByNode && !slices.Contains(h.services, c.key) {
					refuse(c, s, ReasonExternalIPConflict, "spec.externalIPs %s is %s; it is not announced", a, h.describe(svc.Namespace))
				}
				continue // a node's address is served where it lives, with nothing to announce
			}
			claims[a] = append(claims[a], c)
		}
	}
	for _, p := range in.pods {
		v, ok := p.Annotations[AnnotationExternalIP]
		if !ok || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		c := claim{kind: heldByPod, pod: p, created: p.CreationTimestamp, key: portal.ServiceKey{Namespace: p.Namespace, Name: p.Name}}
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		why := r.cfg.podIPRefused(a, p.Namespace)
		switch {
		case err != nil:
			refuse(c, v, ReasonBadAnnotation, "annotation %s: %q is not an IP address", AnnotationExternalIP, v)
			continue
		case p.Spec.HostNetwork:
			refuse(c, v, ReasonExternalIPNotAllowed, "a hostNetwork Pod cannot have an external IP: its traffic is its node's")
			continue
		case why != "":
			refuse(c, v, ReasonExternalIPNotAllowed, "%s", why)
			continue
		}
		a = a.Unmap()
		if h := o.held[a]; h != nil {
			refuse(c, v, ReasonExternalIPConflict, "%s is %s", a, h.describe(p.Namespace))
			continue
		}
		claims[a] = append(claims[a], c)
	}

	last := map[netip.Addr]*holding{}
	for ip, cs := range claims {
		prev := r.last[ip]
		granted, isGranted := in.external[ip]
		incumbent := func(c claim) bool {
			if c.kind == heldByExternalIP {
				return isGranted && c.key.Namespace == granted
			}
			return prev.holds(c)
		}
		slices.SortFunc(cs, func(x, y claim) int {
			if px, py := incumbent(x), incumbent(y); px != py {
				if px {
					return -1
				}
				return 1
			}
			if px, py := x.kind == heldByPod, y.kind == heldByPod; in.settled && px != py {
				if px {
					return -1
				}
				return 1
			}
			if c := x.created.Compare(y.created.Time); c != 0 {
				return c
			}
			if c := cmp.Compare(x.kind, y.kind); c != 0 {
				return c
			}
			return compareKey(x.key, y.key)
		})
		win := cs[0]
		h := &holding{kind: win.kind, namespace: win.key.Namespace}
		if win.kind == heldByPod {
			h.pod = win.key
		}
		for _, c := range cs {
			if win.kind == heldByExternalIP && c.kind == heldByExternalIP && c.key.Namespace == win.key.Namespace {
				if !slices.Contains(h.services, c.key) {
					h.services = append(h.services, c.key)
					o.external[c.key] = append(o.external[c.key], ip)
				}
				continue
			}
			if c.key == win.key && c.kind == win.kind {
				continue
			}
			ns := c.key.Namespace
			if c.kind == heldByExternalIP {
				refuse(c, ip.String(), ReasonExternalIPConflict, "spec.externalIPs %s is %s; it is not announced", ip, h.describe(ns))
			} else {
				refuse(c, ip.String(), ReasonExternalIPConflict, "%s is %s", ip, h.describe(ns))
			}
		}
		slices.SortFunc(h.services, compareKey)
		o.held[ip] = h
		if win.kind == heldByPod {
			last[ip] = h
			if pe, ok := mapPod(win.pod, ip); ok {
				o.pods = append(o.pods, pe)
			}
		}
	}
	r.last = last
	for k := range o.external {
		slices.SortFunc(o.external[k], netip.Addr.Compare)
	}
	slices.SortFunc(o.pods, func(a, b PodExternalIP) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(o.refusals, func(a, b refusal) int {
		return cmp.Or(strings.Compare(a.obj.GetNamespace(), b.obj.GetNamespace()), strings.Compare(a.obj.GetName(), b.obj.GetName()), strings.Compare(a.ip, b.ip))
	})
	return o
}

// seed makes gs the previous answer's Pod holders: a controller taking
// over keeps what its predecessor granted.
func (r *registry) seed(gs []grant) {
	if r.last == nil {
		r.last = map[netip.Addr]*holding{}
	}
	for _, g := range gs {
		k := portal.ServiceKey{Namespace: g.Namespace, Name: g.Name}
		r.last[g.IP] = &holding{kind: heldByPod, pod: k, namespace: g.Namespace}
	}
}

// holds: c is (one of) h's holders.
func (h *holding) holds(c claim) bool {
	if h == nil || h.kind != c.kind {
		return false
	}
	if c.kind == heldByPod {
		return h.pod == c.key
	}
	return h.namespace == c.key.Namespace
}

// mapPod maps ip to p when p runs on a node with a pod IP of ip's family.
func mapPod(p *corev1.Pod, ip netip.Addr) (PodExternalIP, bool) {
	if p.Spec.NodeName == "" {
		return PodExternalIP{}, false
	}
	for _, pip := range p.Status.PodIPs {
		a, err := netip.ParseAddr(pip.IP)
		if err == nil && a.Unmap().Is4() == ip.Is4() {
			return PodExternalIP{IP: ip, PodIP: a.Unmap(), Pod: portal.ServiceKey{Namespace: p.Namespace, Name: p.Name}, NodeName: p.Spec.NodeName}, true
		}
	}
	return PodExternalIP{}, false
}
