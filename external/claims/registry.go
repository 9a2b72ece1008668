package claims

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/config"
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

// HolderKind is who holds an address, strongest first: a claim never
// takes an address from a stronger kind.
type HolderKind uint8

const (
	HeldByNode         HolderKind = iota // a node's own address
	HeldByClusterIP                      // a Service's cluster IP
	HeldByLoadBalancer                   // an LB allocation (Service status, written by the allocator)
	HeldByForeignLB                      // a load-balancer IP another controller gave a Service
	HeldByExternalIP                     // spec.externalIPs of the Services of one namespace
	HeldByPod                            // onehop.io/external-ip on one Pod
)

// Holding says who holds one address.
type Holding struct {
	Kind HolderKind
	// Node names the node (HeldByNode).
	Node string
	// Services hold a cluster, load-balancer or external IP; several
	// share a load-balancer IP (same sharing key) or an external IP (same
	// namespace).
	Services []portal.ServiceKey
	// Pod holds a pod external IP.
	Pod portal.ServiceKey
	// Namespace of the holding Services or Pod.
	Namespace string
}

// describe names the holder for an event on a claimant of namespace ns;
// holders of other namespaces are not named, so that no tenant learns
// another's names.
func (h *Holding) describe(ns string) string {
	switch h.Kind {
	case HeldByNode:
		return "the address of node " + h.Node
	case HeldByClusterIP:
		return "a Service's cluster IP"
	case HeldByForeignLB:
		return "a Service's load-balancer IP from another controller"
	}
	what := map[HolderKind]string{HeldByLoadBalancer: "the load-balancer IP of ", HeldByExternalIP: "an external IP of ", HeldByPod: "the external IP of "}[h.Kind]
	if h.Namespace != ns {
		if h.Kind == HeldByPod {
			return what + "a Pod of another namespace"
		}
		return what + "a Service of another namespace"
	}
	if h.Kind == HeldByPod {
		return what + "Pod " + h.Pod.String()
	}
	names := make([]string, len(h.Services))
	for i, s := range h.Services {
		names[i] = s.String()
	}
	return what + "Service " + strings.Join(names, ", ")
}

// Refusal is a claim the registry turned down, for an event on the
// claimant (Service or Pod).
type Refusal struct {
	Obj    Object // *corev1.Service or *corev1.Pod
	IP     string
	Reason string
	Msg    string
}

// Ownership is the registry's answer: who rightfully holds each address.
type Ownership struct {
	Held map[netip.Addr]*Holding
	// LB and External are each Service's rightful load-balancer and
	// external IPs, sorted.
	LB, External map[portal.ServiceKey][]netip.Addr
	// Pods are the pod external IPs held, mapped when the Pod runs on a
	// node with a pod IP of the address's family; sorted by IP.
	Pods     []PodExternalIP
	Refusals []Refusal
}

// Reserved names who holds ip when that is not a load-balancer allocation
// ("" otherwise): the allocator neither hands out nor keeps such addresses.
func (o *Ownership) Reserved(ip netip.Addr) string {
	if o == nil {
		return ""
	}
	h := o.Held[ip]
	if h == nil || h.Kind == HeldByLoadBalancer {
		return ""
	}
	return h.describe("")
}

// Input is the cluster state the registry reads.
type Input struct {
	Services []*corev1.Service
	Pods     []*corev1.Pod
	Nodes    []*corev1.Node
	// Settled: the pods hold what the controller granted them
	// (SettledPods), so a Pod's claim wins over spec.externalIPs.
	Settled bool
	// External are the controller's grants of spec.externalIPs addresses
	// (address -> namespace): that namespace's Services hold the address
	// while they list it.
	External map[netip.Addr]string
}

// Registry decides who holds each external address: one holder per address
// (a node, a cluster IP, the Services sharing a load-balancer IP, the
// Services of one namespace listing it in spec.externalIPs, or one Pod). A
// claim on a held address is refused and the holder keeps it. Kinds rank
// as HolderKind says. Between spec.externalIPs claims (and between them
// and Pods) the namespace the controller granted the address keeps it
// (Input.External); without a grant the oldest object wins. That
// is API state alone, so every agent, restarted or not, gives an address
// to the same Services. Between Pods, the one that held the address last
// time keeps it (last; the controller records it as a grant).
type Registry struct {
	cfg *config.Parsed
	// last holds the Pod holders of the previous answer.
	last map[netip.Addr]*Holding
}

// New is a registry of the configuration cfg.
func New(cfg *config.Parsed) *Registry { return &Registry{cfg: cfg} }

// SetConfig puts cfg in force from the next Resolve.
func (r *Registry) SetConfig(cfg *config.Parsed) { r.cfg = cfg }

// claim is one Service's or Pod's claim on an address.
type claim struct {
	kind    HolderKind
	svc     *corev1.Service
	pod     *corev1.Pod
	created metav1.Time
	key     portal.ServiceKey
}

// Object is a Service or a Pod, something an event can be put on.
type Object interface {
	metav1.Object
	runtime.Object
}

func (c claim) obj() Object {
	if c.pod != nil {
		return c.pod
	}
	return c.svc
}

// Resolve computes the ownership of every address in in.
func (r *Registry) Resolve(in Input) *Ownership {
	o := &Ownership{Held: map[netip.Addr]*Holding{}, LB: map[portal.ServiceKey][]netip.Addr{}, External: map[portal.ServiceKey][]netip.Addr{}}
	refuse := func(c claim, ip, reason, format string, a ...any) {
		o.Refusals = append(o.Refusals, Refusal{Obj: c.obj(), IP: ip, Reason: reason, Msg: fmt.Sprintf(format, a...)})
	}

	// Nodes' addresses and cluster IPs first: nothing takes them.
	for _, n := range in.Nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				if _, ok := o.Held[ip.Unmap()]; !ok {
					o.Held[ip.Unmap()] = &Holding{Kind: HeldByNode, Node: n.Name}
				}
			}
		}
	}
	svcs := slices.Clone(in.Services)
	slices.SortFunc(svcs, alloc.OlderFirst)
	for _, svc := range svcs {
		for _, s := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
			if ip, err := netip.ParseAddr(s); err == nil {
				if _, ok := o.Held[ip.Unmap()]; !ok {
					o.Held[ip.Unmap()] = &Holding{Kind: HeldByClusterIP, Services: []portal.ServiceKey{alloc.KeyOf(svc)}, Namespace: svc.Namespace}
				}
			}
		}
	}

	// Load-balancer allocations: what the allocator wrote to the status of
	// managed Services, restored oldest first as a new allocator would.
	if a, err := ipam.New(r.cfg.IPAMPools); err == nil {
		a.Reserved = o.Reserved
		for _, svc := range svcs {
			ips := alloc.StatusIPs(svc)
			if len(ips) == 0 || !alloc.Managed(r.cfg, svc) {
				continue
			}
			req, _ := alloc.RequestFor(svc)
			if a.Restore(req, ips) != nil {
				continue // the allocator moves it (and says so)
			}
			k := alloc.KeyOf(svc)
			for _, ip := range a.Holds(k) {
				h := o.Held[ip]
				if h == nil {
					h = &Holding{Kind: HeldByLoadBalancer, Namespace: svc.Namespace}
					o.Held[ip] = h
				}
				h.Services = append(h.Services, k)
				if h.Namespace != svc.Namespace {
					h.Namespace = "" // shared across namespaces: none of them alone
				}
				o.LB[k] = append(o.LB[k], ip)
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
		for _, ip := range alloc.StatusIPs(svc) {
			if _, ok := o.Held[ip]; !ok {
				o.Held[ip] = &Holding{Kind: HeldByForeignLB, Services: []portal.ServiceKey{alloc.KeyOf(svc)}, Namespace: svc.Namespace}
			}
		}
	}

	// spec.externalIPs and pod external IPs compete for what is left.
	claims := map[netip.Addr][]claim{}
	for _, svc := range svcs {
		c := claim{kind: HeldByExternalIP, svc: svc, created: svc.CreationTimestamp, key: alloc.KeyOf(svc)}
		seen := map[netip.Addr]bool{}
		for _, s := range svc.Spec.ExternalIPs {
			a, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil || !r.cfg.ExternalIPAllowed(a) {
				refuse(c, s, ReasonExternalIPNotAllowed, "spec.externalIPs %q is outside --external-ip-cidrs; it is not served", s)
				continue
			}
			a = a.Unmap()
			if seen[a] {
				continue
			}
			seen[a] = true
			if h := o.Held[a]; h != nil {
				if h.Kind != HeldByNode && !slices.Contains(h.Services, c.key) {
					refuse(c, s, ReasonExternalIPConflict, "spec.externalIPs %s is %s; it is not announced", a, h.describe(svc.Namespace))
				}
				continue // a node's address is served where it lives, with nothing to announce
			}
			claims[a] = append(claims[a], c)
		}
	}
	for _, p := range in.Pods {
		v, ok := p.Annotations[AnnotationExternalIP]
		if !ok || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		c := claim{kind: HeldByPod, pod: p, created: p.CreationTimestamp, key: portal.ServiceKey{Namespace: p.Namespace, Name: p.Name}}
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		why := r.cfg.PodIPRefused(a, p.Namespace)
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
		if h := o.Held[a]; h != nil {
			refuse(c, v, ReasonExternalIPConflict, "%s is %s", a, h.describe(p.Namespace))
			continue
		}
		claims[a] = append(claims[a], c)
	}

	last := map[netip.Addr]*Holding{}
	for ip, cs := range claims {
		prev := r.last[ip]
		granted, isGranted := in.External[ip]
		incumbent := func(c claim) bool {
			if c.kind == HeldByExternalIP {
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
			if px, py := x.kind == HeldByPod, y.kind == HeldByPod; in.Settled && px != py {
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
			return CompareKeys(x.key, y.key)
		})
		win := cs[0]
		h := &Holding{Kind: win.kind, Namespace: win.key.Namespace}
		if win.kind == HeldByPod {
			h.Pod = win.key
		}
		for _, c := range cs {
			if win.kind == HeldByExternalIP && c.kind == HeldByExternalIP && c.key.Namespace == win.key.Namespace {
				if !slices.Contains(h.Services, c.key) {
					h.Services = append(h.Services, c.key)
					o.External[c.key] = append(o.External[c.key], ip)
				}
				continue
			}
			if c.key == win.key && c.kind == win.kind {
				continue
			}
			ns := c.key.Namespace
			if c.kind == HeldByExternalIP {
				refuse(c, ip.String(), ReasonExternalIPConflict, "spec.externalIPs %s is %s; it is not announced", ip, h.describe(ns))
			} else {
				refuse(c, ip.String(), ReasonExternalIPConflict, "%s is %s", ip, h.describe(ns))
			}
		}
		slices.SortFunc(h.Services, CompareKeys)
		o.Held[ip] = h
		if win.kind == HeldByPod {
			last[ip] = h
			if pe, ok := mapPod(win.pod, ip); ok {
				o.Pods = append(o.Pods, pe)
			}
		}
	}
	r.last = last
	for k := range o.External {
		slices.SortFunc(o.External[k], netip.Addr.Compare)
	}
	slices.SortFunc(o.Pods, func(a, b PodExternalIP) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(o.Refusals, func(a, b Refusal) int {
		return cmp.Or(strings.Compare(a.Obj.GetNamespace(), b.Obj.GetNamespace()), strings.Compare(a.Obj.GetName(), b.Obj.GetName()), strings.Compare(a.IP, b.IP))
	})
	return o
}

// Seed makes gs the previous answer's Pod holders: a controller taking
// over keeps what its predecessor granted.
func (r *Registry) Seed(gs []Grant) {
	if r.last == nil {
		r.last = map[netip.Addr]*Holding{}
	}
	for _, g := range gs {
		k := portal.ServiceKey{Namespace: g.Namespace, Name: g.Name}
		r.last[g.IP] = &Holding{Kind: HeldByPod, Pod: k, Namespace: g.Namespace}
	}
}

// holds: c is (one of) h's holders.
func (h *Holding) holds(c claim) bool {
	if h == nil || h.Kind != c.kind {
		return false
	}
	if c.kind == HeldByPod {
		return h.Pod == c.key
	}
	return h.Namespace == c.key.Namespace
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

// CompareKeys orders Service (or Pod) keys by namespace, then name.
func CompareKeys(a, b portal.ServiceKey) int {
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}
