package config

import (
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/ipam"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/webhook"
)

// Config is the "external" section of onehop's configuration file.
type Config struct {
	// Pools hand out LoadBalancer IPs (and, when AllowPods, pod external IPs).
	Pools []PoolConfig `json:"pools,omitempty"`
	// ClasslessIgnored leaves type LoadBalancer Services without a
	// loadBalancerClass to another controller (a cloud-controller-manager);
	// onehop then only handles class onehop.io/lb.
	ClasslessIgnored bool `json:"classlessIgnored,omitempty"`
	// ExternalIPCIDRs are where spec.externalIPs and pod external IPs may be
	// (the agent's --external-ip-cidrs, which the dataplane also enforces).
	// Pod external IPs may also be in pools with AllowPods.
	ExternalIPCIDRs []string `json:"externalIPCIDRs,omitempty"`
	// LeaseNamespace holds the allocator's and the L2 liveness Leases
	// (default kube-system).
	LeaseNamespace string `json:"leaseNamespace,omitempty"`
	// LeaderLease tunes the allocator's leader election (defaults 15s/10s/2s).
	LeaderLease LeaseTiming `json:"leaderLease,omitzero"`

	// SeparateController leaves the cluster-wide part of the hook (the
	// allocator, Service status, the webhook and refusal events) to
	// `agent controller`, a Deployment of its own with its own RBAC; the
	// node agents then run only the per-node part (providers, their own
	// liveness Lease) and write nothing cluster-wide. Off: every agent
	// campaigns for the cluster-wide part itself (one binary, one RBAC).
	SeparateController bool `json:"separateController,omitempty"`

	// PodExternalIPs watches Pods for onehop.io/external-ip (off by
	// default). With SeparateController the controller watches every Pod
	// and grants the addresses, and a node agent watches only its own
	// node's Pods; without it every agent watches every Pod.
	PodExternalIPs bool `json:"podExternalIPs,omitempty"`

	// CRDs adds the onehop.io custom resources (LoadBalancerIPPool,
	// BGPPeer, BGPAdvertisement, L2Advertisement, LoadBalancerWebhook;
	// package external/api/v1alpha1) to this section and follows their
	// changes without a restart. The CRDs must be installed (deploy/ does)
	// and the hook given a dynamic client (WithDynamicClient). This section
	// is then the bootstrap configuration the resources add to.
	CRDs bool `json:"crds,omitempty"`

	BGP *bgp.Config `json:"bgp,omitempty"`
	L2  *l2.Config  `json:"l2,omitempty"`
	// Webhook applies while no LoadBalancerWebhook is accepted (CRDs): an
	// accepted one replaces it.
	Webhook *webhook.Config `json:"webhook,omitempty"`

	// What the custom resources add that the file cannot say (node.go):
	// the advertisements, an error of this node's BGP settings (a router
	// ID annotation that is missing, say), which makes BGP fail to start,
	// and the L2 interfaces picked by pattern.
	ads        *AdRules
	bgpErr     error
	l2Patterns []string
	// webhookPools, when not nil, are the only pools whose addresses the
	// webhook is told about (a LoadBalancerWebhook's pool selection).
	webhookPools map[string]bool
}

// PoolConfig is one address pool.
type PoolConfig struct {
	Name string `json:"name"`
	// Addresses are CIDRs ("192.0.2.0/24"), ranges ("192.0.2.10-192.0.2.20")
	// or single addresses, IPv4 and IPv6. An IPv4 CIDR of /30 or larger
	// does not hand out its network and broadcast addresses, an IPv6 CIDR
	// of /126 or larger not its first (Subnet-Router anycast) address,
	// unless KeepNetworkAndBroadcast.
	Addresses []string `json:"addresses"`
	// AutoAssign (default true) lets Services that name no pool use it.
	// Pools with AllowPods are never auto-assigned.
	AutoAssign *bool `json:"autoAssign,omitempty"`
	// AllowPods lets Pods claim its addresses with onehop.io/external-ip,
	// those of the namespaces it serves.
	AllowPods bool `json:"allowPods,omitempty"`

	// Namespaces, when set, are the only namespaces whose Services may
	// use the pool (auto-assigned, named, or by requested address), and
	// whose Pods may claim its addresses.
	Namespaces []string `json:"namespaces,omitempty"`
	// ServiceSelectors, when set, admit only the Services whose labels
	// match one of them, and no Pod.
	ServiceSelectors []metav1.LabelSelector `json:"serviceSelectors,omitempty"`
	// Priority orders auto-assignment between the pools that admit a
	// Service: lower values first; pools without a priority come last, in
	// configuration order.
	Priority *int `json:"priority,omitempty"`
	// ShareAcrossNamespaces lets Services of different namespaces share an
	// address under one onehop.io/allow-shared-ip key; by default a key
	// joins only Services of one namespace.
	ShareAcrossNamespaces bool `json:"shareAcrossNamespaces,omitempty"`
	// KeepNetworkAndBroadcast hands out every address of the pool's CIDRs.
	KeepNetworkAndBroadcast bool `json:"keepNetworkAndBroadcast,omitempty"`
}

// LeaseTiming are leader-election durations.
type LeaseTiming struct {
	Duration      Duration `json:"duration,omitzero"`
	RenewDeadline Duration `json:"renewDeadline,omitzero"`
	RetryPeriod   Duration `json:"retryPeriod,omitzero"`
}

// Duration is a time.Duration written as "15s" in configuration files.
type Duration struct{ time.Duration }

// UnmarshalJSON accepts "1.5s" or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' {
		v, err := time.ParseDuration(s[1 : len(s)-1])
		if err != nil {
			return err
		}
		d.Duration = v
		return nil
	}
	var f float64
	if _, err := fmt.Sscan(s, &f); err != nil {
		return fmt.Errorf("bad duration %s", s)
	}
	d.Duration = time.Duration(f * float64(time.Second))
	return nil
}

// MarshalJSON writes "15s".
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

func (t LeaseTiming) withDefaults() LeaseTiming {
	if t.Duration.Duration <= 0 {
		t.Duration.Duration = 15 * time.Second
	}
	if t.RenewDeadline.Duration <= 0 || t.RenewDeadline.Duration >= t.Duration.Duration {
		t.RenewDeadline.Duration = t.Duration.Duration / 3 * 2
	}
	// Leader election wants the renew deadline above 1.2 retry periods
	// (leaderelection.JitterFactor), computed as client-go does.
	if t.RetryPeriod.Duration <= 0 || t.RenewDeadline.Duration <= time.Duration(1.2*float64(t.RetryPeriod.Duration)) {
		t.RetryPeriod.Duration = t.RenewDeadline.Duration / 5
	}
	return t
}

// BGPError is what keeps this node's BGP speaker from starting: an error
// of its settings from the custom resources (a router ID annotation that
// is missing, say); nil when there is none.
func (c Config) BGPError() error { return c.bgpErr }

// L2Patterns are the interface patterns of the L2Advertisements that pick
// this node (interfacePattern), which the responder's interfaces are
// matched against when it starts.
func (c Config) L2Patterns() []string { return c.l2Patterns }

// Parsed is Config checked and turned into values.
type Parsed struct {
	Config
	// IPAMPools are Pools as the allocator takes them.
	IPAMPools []ipam.Pool
	extCIDR   []netip.Prefix
}

// Parse checks c and turns it into values.
func (c Config) Parse() (*Parsed, error) {
	p := &Parsed{Config: c}
	if p.LeaseNamespace == "" {
		p.LeaseNamespace = "kube-system"
	}
	p.LeaderLease = p.LeaderLease.withDefaults()
	if p.LeaderLease.RetryPeriod.Duration <= 0 {
		return nil, fmt.Errorf("leaderLease: duration %v is too short to elect a leader", p.LeaderLease.Duration)
	}
	if c.L2 != nil {
		if err := c.L2.Validate(); err != nil {
			return nil, err
		}
	}
	for _, pc := range c.Pools {
		pool, err := pc.pool()
		if err != nil {
			return nil, err
		}
		p.IPAMPools = append(p.IPAMPools, pool)
	}
	if _, err := ipam.New(p.IPAMPools); err != nil {
		return nil, err
	}
	for _, s := range c.ExternalIPCIDRs {
		pre, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("externalIPCIDRs: %v", err)
		}
		p.extCIDR = append(p.extCIDR, pre.Masked())
	}
	return p, nil
}

// pool is pc checked and turned into an ipam.Pool.
func (pc PoolConfig) pool() (ipam.Pool, error) {
	o := ipam.PoolOptions{
		AutoAssign: pc.AutoAssign == nil || *pc.AutoAssign, AllowPods: pc.AllowPods,
		Namespaces: pc.Namespaces, Priority: math.MaxInt,
		ShareAcrossNamespaces: pc.ShareAcrossNamespaces, KeepNetworkAndBroadcast: pc.KeepNetworkAndBroadcast,
	}
	if pc.Priority != nil {
		o.Priority = *pc.Priority
	}
	for i := range pc.ServiceSelectors {
		sel, err := metav1.LabelSelectorAsSelector(&pc.ServiceSelectors[i])
		if err != nil {
			return ipam.Pool{}, fmt.Errorf("pool %q: serviceSelectors[%d]: %w", pc.Name, i, err)
		}
		o.Selectors = append(o.Selectors, sel)
	}
	return ipam.NewPool(pc.Name, pc.Addresses, o)
}

// ExternalIPAllowed: spec.externalIPs are allowed inside ExternalIPCIDRs
// only, as the dataplane does (--external-ip-cidrs); pool addresses are the
// allocator's to hand out.
func (p *Parsed) ExternalIPAllowed(a netip.Addr) bool {
	a = a.Unmap()
	return slices.ContainsFunc(p.extCIDR, func(c netip.Prefix) bool { return c.Contains(a) })
}

// PodIPRefused says why a Pod of namespace ns may not claim a as its
// external IP, "" when it may. An address of a pool is the pool's to give,
// as to Services: the pool must be for Pods (AllowPods, or inside
// ExternalIPCIDRs), its Namespaces must admit ns, and it must select no
// Services by label (serviceSelectors admit only the Services they match,
// and a Pod is none). An address in no pool must be inside
// ExternalIPCIDRs.
func (p *Parsed) PodIPRefused(a netip.Addr, ns string) string {
	a = a.Unmap()
	inCIDRs := p.ExternalIPAllowed(a)
	for i := range p.IPAMPools {
		pool := &p.IPAMPools[i]
		if !pool.Contains(a) || !pool.AllowPods && !inCIDRs {
			continue
		}
		if len(pool.Selectors) > 0 {
			return fmt.Sprintf("%s is in address pool %q, which serves only the Services its serviceSelectors match, no Pod", a, pool.Name)
		}
		if !pool.Admits(ns, nil) {
			return fmt.Sprintf("%s is in address pool %q, which does not serve Pods of namespace %s", a, pool.Name, ns)
		}
		return ""
	}
	if !inCIDRs {
		return fmt.Sprintf("%s is outside the allowed external IP CIDRs and the pools marked for pods", a)
	}
	return ""
}

// Settles reports whether the controller settles who holds external
// addresses: a split install with pod external IPs on or externalIPCIDRs
// set. Node agents then follow the controller's grants (and, for pod
// external IPs, watch only their own node's Pods); without a separate
// controller every agent settles them itself.
func (p *Parsed) Settles() bool {
	return p.SeparateController && (p.PodExternalIPs || len(p.extCIDR) > 0)
}

// SameBGP: this node's BGP speaker need not change.
func SameBGP(a, b *Parsed) bool {
	return reflect.DeepEqual(a.BGP, b.BGP) && errString(a.bgpErr) == errString(b.bgpErr)
}

// SameL2: this node's L2 responder need not start again.
func SameL2(a, b *Parsed) bool {
	return reflect.DeepEqual(a.L2, b.L2) && slices.Equal(a.l2Patterns, b.l2Patterns)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
