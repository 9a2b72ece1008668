package config

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/ipam"
)

// Objects are the cloud hook's custom resources as listed, and the
// Secrets of the lease namespace (BGP passwords, the webhook's key) and its
// ConfigMaps (the webhook's CA): name -> key -> value.
type Objects struct {
	Pools      []*v1alpha1.LoadBalancerIPPool
	Peers      []*v1alpha1.BGPPeer
	BGPAds     []*v1alpha1.BGPAdvertisement
	L2Ads      []*v1alpha1.L2Advertisement
	Webhooks   []*v1alpha1.LoadBalancerWebhook
	Secrets    map[string]map[string][]byte
	ConfigMaps map[string]map[string][]byte
}

// Add appends an empty object of one of the onehop.io kinds to in and
// returns it, to be decoded into; nil for another kind.
func (in *Objects) Add(kind string) metav1.Object {
	switch kind {
	case KindPool:
		o := &v1alpha1.LoadBalancerIPPool{}
		in.Pools = append(in.Pools, o)
		return o
	case KindPeer:
		o := &v1alpha1.BGPPeer{}
		in.Peers = append(in.Peers, o)
		return o
	case KindBGPAd:
		o := &v1alpha1.BGPAdvertisement{}
		in.BGPAds = append(in.BGPAds, o)
		return o
	case KindL2Ad:
		o := &v1alpha1.L2Advertisement{}
		in.L2Ads = append(in.L2Ads, o)
		return o
	case KindWebhook:
		o := &v1alpha1.LoadBalancerWebhook{}
		in.Webhooks = append(in.Webhooks, o)
		return o
	}
	return nil
}

// Kinds as verdicts name them.
const (
	KindPool  = "LoadBalancerIPPool"
	KindPeer  = "BGPPeer"
	KindBGPAd = "BGPAdvertisement"
	KindL2Ad  = "L2Advertisement"
	// KindWebhook is read by the cluster-wide part alone.
	KindWebhook = "LoadBalancerWebhook"
)

// Verdict says whether one object is in force.
type Verdict struct {
	Kind, Name string
	UID        types.UID
	Generation int64
	// Err is nil when the object is accepted; otherwise why not.
	Err error
	// Stale: the object is invalid, and its last accepted version is in
	// force instead.
	Stale bool
	// Note adds to an accepted object's message.
	Note string
}

// Memory is the last accepted version of every object, by UID: an
// object that turns invalid keeps that version in force. A peer's is kept
// with its password, so that a deleted Secret does not drop a session.
type Memory struct {
	pools  map[types.UID]PoolConfig
	peers  map[types.UID]PeerRule
	bgpAds map[types.UID]AdRule
	l2Ads  map[types.UID]AdRule
	// webhooks are kept with their key, as peers with their password.
	webhooks map[types.UID]webhookRule
}

// Converted is what the custom resources make of the bootstrap
// configuration, before any node's part (ForNode) is picked.
type Converted struct {
	// Config is the bootstrap configuration with the accepted pools after
	// its own.
	Config Config
	// Peers are the accepted BGP peers, oldest first.
	Peers []PeerRule
	// ads are the accepted advertisements.
	ads AdRules
	// Verdicts has one entry per object, in the order of Objects.
	Verdicts []Verdict
	// passwords are the values the BGPPeers name (bgpPasswords): what
	// the controller of a split install publishes to the node agents.
	passwords map[string]map[string][]byte
}

// PeerRule is an accepted BGPPeer: the peer as the speaker takes it, and
// the nodes and per-node settings it comes with.
type PeerRule struct {
	name  string
	asn   uint32
	peer  bgp.Peer
	nodes labels.Selector // nil: every node
	// routerID and the next hops come from each node (ForNode).
	routerID, nextHop4, nextHop6 *v1alpha1.NodeValue
}

// PicksNode reports whether the peer is one of the node's of labels l.
func (r PeerRule) PicksNode(l labels.Set) bool { return r.nodes == nil || r.nodes.Matches(l) }

// Convert adds the custom resources in to base, the file's external
// section. Each object is checked alone and against those before it,
// oldest first (so that a new object never invalidates an older one): an
// invalid object is left out, or replaced by its last accepted version in
// mem, and the others apply. It returns the memory of this round, which
// forgets deleted objects.
func Convert(base Config, in Objects, mem Memory) (Converted, Memory) {
	out := Converted{Config: base}
	out.Config.Pools = slices.Clone(base.Pools)
	next := Memory{pools: map[types.UID]PoolConfig{}, peers: map[types.UID]PeerRule{},
		bgpAds: map[types.UID]AdRule{}, l2Ads: map[types.UID]AdRule{}, webhooks: map[types.UID]webhookRule{}}

	// Pools: unique names (the file's own come first), no overlap.
	var pools []ipam.Pool
	names := map[string]bool{}
	for _, pc := range base.Pools {
		names[pc.Name] = true
		if p, err := pc.pool(); err == nil {
			pools = append(pools, p)
		}
	}
	for _, o := range oldestFirst(in.Pools) {
		v := Verdict{Kind: KindPool, Name: o.Name, UID: o.UID, Generation: o.Generation}
		try := func(pc PoolConfig) error {
			if names[pc.Name] {
				return fmt.Errorf("the configuration file has a pool named %q", pc.Name)
			}
			p, err := pc.pool()
			if err != nil {
				return err
			}
			if _, err := ipam.New(append(slices.Clone(pools), p)); err != nil {
				return err
			}
			pools = append(pools, p)
			out.Config.Pools = append(out.Config.Pools, pc)
			return nil
		}
		if pc, ok := decide(&v, poolConfig(o), nil, mem.pools, try); ok {
			next.pools[o.UID] = pc
		}
		out.Verdicts = append(out.Verdicts, v)
	}
	out.ads.PoolLabels = map[string]labels.Set{}
	for _, o := range in.Pools {
		out.ads.PoolLabels[o.Name] = labels.Set(o.Labels)
	}

	// BGP peers: one speaker per node, so one ASN, router ID and next
	// hops for all (the file's, or the oldest peer's); one session per
	// address.
	addrs := map[netip.Addr]bool{}
	if base.BGP != nil {
		for _, p := range base.BGP.Peers {
			if a, err := netip.ParseAddr(p.Address); err == nil {
				addrs[a] = true
			}
		}
	}
	passwords, webhookKeys := bgpPasswords(in)
	out.passwords = passwords
	for _, o := range oldestFirst(in.Peers) {
		v := Verdict{Kind: KindPeer, Name: o.Name, UID: o.UID, Generation: o.Generation}
		try := func(r PeerRule) error {
			if err := r.agrees(base.BGP, out.Peers); err != nil {
				return err
			}
			a := netip.MustParseAddr(r.peer.Address)
			if addrs[a] {
				return fmt.Errorf("peer %s is configured already (by the configuration file or an older BGPPeer)", a)
			}
			addrs[a] = true
			out.Peers = append(out.Peers, r)
			return nil
		}
		r, err := resolvePeer(o, passwords)
		if ref := o.Spec.PasswordSecret; ref != nil && webhookKeys[*ref] != "" {
			err = webhookKeyError(*ref, webhookKeys[*ref])
		}
		if r, ok := decide(&v, r, err, mem.peers, try); ok {
			next.peers[o.UID] = r
		}
		out.Verdicts = append(out.Verdicts, v)
	}

	for _, o := range oldestFirst(in.BGPAds) {
		v := Verdict{Kind: KindBGPAd, Name: o.Name, UID: o.UID, Generation: o.Generation}
		r, err := newAdRule(o.Name, o.Spec.PoolSelection, o.Spec.NodeSelectors, nil, "")
		if err == nil {
			r.Route, err = bgpRouteAttrs(&o.Spec)
		}
		try := func(r AdRule) error {
			if err := r.aggregationFits(out.Config.Pools, out.ads.PoolLabels); err != nil {
				return fmt.Errorf("aggregation: %w", err)
			}
			out.ads.BGP = append(out.ads.BGP, r)
			return nil
		}
		if r, ok := decide(&v, r, err, mem.bgpAds, try); ok {
			next.bgpAds[o.UID] = r
		}
		out.Verdicts = append(out.Verdicts, v)
	}
	for _, o := range oldestFirst(in.L2Ads) {
		v := Verdict{Kind: KindL2Ad, Name: o.Name, UID: o.UID, Generation: o.Generation}
		r, err := newAdRule(o.Name, o.Spec.PoolSelection, o.Spec.NodeSelectors, o.Spec.Interfaces, o.Spec.InterfacePattern)
		try := func(r AdRule) error { out.ads.L2 = append(out.ads.L2, r); return nil }
		if r, ok := decide(&v, r, err, mem.l2Ads, try); ok {
			next.l2Ads[o.UID] = r
		}
		out.Verdicts = append(out.Verdicts, v)
	}
	out.addWebhooks(base, in, mem, next)
	return out, next
}

// decide tries an object's current version (unless it did not even
// convert: convErr), then its last accepted one; it fills v and returns
// the version in force, if any.
func decide[T any](v *Verdict, cur T, convErr error, last map[types.UID]T, try func(T) error) (T, bool) {
	err := convErr
	if err == nil {
		if err = try(cur); err == nil {
			return cur, true
		}
	}
	v.Err = err
	if prev, ok := last[v.UID]; ok && try(prev) == nil {
		v.Stale = true
		return prev, true
	}
	var zero T
	return zero, false
}

// oldestFirst sorts objects by creation, then name.
func oldestFirst[T metav1.Object](objs []T) []T {
	out := slices.Clone(objs)
	slices.SortStableFunc(out, func(a, b T) int {
		if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
			return c
		}
		return cmp.Compare(a.GetName(), b.GetName())
	})
	return out
}

// poolConfig is a LoadBalancerIPPool as the file would say it.
func poolConfig(o *v1alpha1.LoadBalancerIPPool) PoolConfig {
	s := o.Spec
	pc := PoolConfig{Name: o.Name, Addresses: s.Addresses, AutoAssign: s.AutoAssign, AllowPods: s.AllowPods,
		Namespaces: s.Namespaces, ServiceSelectors: s.ServiceSelectors, ShareAcrossNamespaces: s.ShareAcrossNamespaces,
		KeepNetworkAndBroadcast: s.AvoidNetworkAndBroadcast != nil && !*s.AvoidNetworkAndBroadcast}
	if s.Priority != nil {
		p := int(*s.Priority)
		pc.Priority = &p
	}
	return pc
}

// resolvePeer checks a BGPPeer alone and reads its password.
func resolvePeer(o *v1alpha1.BGPPeer, secrets map[string]map[string][]byte) (PeerRule, error) {
	s := o.Spec
	r := PeerRule{name: o.Name, routerID: s.RouterID, nextHop4: s.NextHopIPv4, nextHop6: s.NextHopIPv6}
	for _, asn := range []int64{s.MyASN, s.PeerASN} {
		if asn < 1 || asn > 1<<32-1 {
			return r, fmt.Errorf("AS number %d is outside 1..4294967295", asn)
		}
	}
	a, err := netip.ParseAddr(s.PeerAddress)
	if err != nil {
		return r, fmt.Errorf("peerAddress: %w", err)
	}
	if s.PeerPort < 0 || s.PeerPort > 65535 || s.EBGPMultihop < 0 || s.EBGPMultihop > 255 ||
		s.HoldTimeSeconds != 0 && (s.HoldTimeSeconds < 3 || s.HoldTimeSeconds > 65535) {
		return r, errors.New("peerPort, ebgpMultihop or holdTimeSeconds is out of range")
	}
	if s.EBGPMultihop > 0 && s.MyASN == s.PeerASN {
		return r, errors.New("ebgpMultihop is for eBGP: myASN and peerASN differ")
	}
	r.asn = uint32(s.MyASN)
	r.peer = bgp.Peer{Address: a.String(), ASN: uint32(s.PeerASN), Port: uint16(s.PeerPort), Multihop: uint8(s.EBGPMultihop),
		HoldTimeSeconds: uint64(s.HoldTimeSeconds)}
	if s.BFD != nil {
		r.peer.BFD = true
		r.peer.BFDIntervalMillis = uint32(max(s.BFD.IntervalMillis, 0))
	}
	if g := s.GracefulRestart; g != nil {
		if g.RestartTimeSeconds < 0 || g.RestartTimeSeconds > 4095 {
			return r, errors.New("gracefulRestart.restartTimeSeconds is out of range")
		}
		r.peer.GracefulRestart = true
		r.peer.GracefulRestartSeconds = uint16(g.RestartTimeSeconds)
	}
	if ref := s.PasswordSecret; ref != nil {
		pw, err := keyValue(secrets, "Secret", *ref, "passwordSecret")
		if err != nil {
			return r, err
		}
		r.peer.Password = string(pw)
	}
	if s.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(s.NodeSelector)
		if err != nil {
			return r, fmt.Errorf("nodeSelector: %w", err)
		}
		r.nodes = sel
	}
	for _, nv := range []*v1alpha1.NodeValue{s.RouterID, s.NextHopIPv4, s.NextHopIPv6} {
		if nv != nil && btoi(nv.Annotation != "")+btoi(nv.Label != "")+btoi(nv.AddressType != "") != 1 {
			return r, errors.New("routerID and next hops need exactly one of annotation, label and addressType")
		}
	}
	return r, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// agrees checks that r fits the one speaker each node runs: the same ASN,
// router ID and next hops as the file's bgp section (which then sets them)
// or the oldest accepted peer.
func (r PeerRule) agrees(file *bgp.Config, accepted []PeerRule) error {
	if file != nil {
		if r.asn != file.ASN {
			return fmt.Errorf("myASN %d differs from the configuration file's asn %d: a node has one BGP speaker", r.asn, file.ASN)
		}
		if r.routerID != nil || r.nextHop4 != nil || r.nextHop6 != nil {
			return errors.New("routerID and next hops come from the configuration file's bgp section, which is set")
		}
		return nil
	}
	if len(accepted) == 0 {
		return nil
	}
	ref := accepted[0]
	if r.asn != ref.asn {
		return fmt.Errorf("myASN %d differs from BGPPeer %s's %d: a node has one BGP speaker", r.asn, ref.name, ref.asn)
	}
	if !reflect.DeepEqual(r.routerID, ref.routerID) || !reflect.DeepEqual(r.nextHop4, ref.nextHop4) || !reflect.DeepEqual(r.nextHop6, ref.nextHop6) {
		return fmt.Errorf("routerID or next hops differ from BGPPeer %s's: a node has one BGP speaker", ref.name)
	}
	return nil
}

// newAdRule checks an advertisement.
func newAdRule(name string, ps v1alpha1.PoolSelection, nodes []metav1.LabelSelector, ifaces []string, pattern string) (AdRule, error) {
	r := AdRule{Name: name, Pools: ps.IPAddressPools, Interfaces: ifaces}
	for i := range ps.IPAddressPoolSelectors {
		sel, err := metav1.LabelSelectorAsSelector(&ps.IPAddressPoolSelectors[i])
		if err != nil {
			return r, fmt.Errorf("ipAddressPoolSelectors[%d]: %w", i, err)
		}
		r.PoolSelectors = append(r.PoolSelectors, sel)
	}
	for i := range nodes {
		sel, err := metav1.LabelSelectorAsSelector(&nodes[i])
		if err != nil {
			return r, fmt.Errorf("nodeSelectors[%d]: %w", i, err)
		}
		r.Nodes = append(r.Nodes, sel)
	}
	if pattern != "" {
		if _, err := regexp.Compile("^(?:" + pattern + ")$"); err != nil {
			return r, fmt.Errorf("interfacePattern: %w", err)
		}
		r.Pattern = pattern
	}
	return r, nil
}

// bgpRouteAttrs checks a BGPAdvertisement's route attributes.
func bgpRouteAttrs(spec *v1alpha1.BGPAdvertisementSpec) (RouteAttrs, error) {
	var r RouteAttrs
	for _, l := range []struct {
		name string
		v    *int32
		max  int
		dst  *int
	}{{"aggregationLength", spec.AggregationLength, 32, &r.agg4}, {"aggregationLengthV6", spec.AggregationLengthV6, 128, &r.agg6}} {
		if l.v == nil {
			continue
		}
		if *l.v < 1 || int(*l.v) > l.max {
			return r, fmt.Errorf("%s %d: want 1 to %d", l.name, *l.v, l.max)
		}
		*l.dst = int(*l.v)
	}
	if r.aggregates() && len(spec.IPAddressPools) == 0 && len(spec.IPAddressPoolSelectors) == 0 {
		return r, errors.New("aggregationLength needs ipAddressPools or ipAddressPoolSelectors: without them the advertisement picks addresses outside every pool too, whose prefixes onehop cannot vouch for")
	}
	var err error
	if r.communities, r.large, err = bgp.ParseCommunities(spec.Communities); err != nil {
		return r, err
	}
	if spec.LocalPref != nil {
		lp := *spec.LocalPref
		r.localPref = &lp
	}
	return r, nil
}

// aggregationFits checks that every pool the advertisement picks is made
// of whole prefixes of its aggregation lengths: a router sends the whole
// announced prefix to the node, and an address in it outside the pool
// could be another tenant's, or nobody's.
func (r *AdRule) aggregationFits(pools []PoolConfig, poolLabels map[string]labels.Set) error {
	if !r.Route.aggregates() {
		return nil
	}
	for _, pc := range pools {
		if !r.selectsAddress(pc.Name, poolLabels) {
			continue
		}
		for _, a := range pc.Addresses {
			rg, err := ipam.ParseRange(a)
			if err != nil {
				continue // the pool itself is refused for it
			}
			bits := r.Route.agg4
			if rg.First.Is6() {
				bits = r.Route.agg6
			}
			if bits == 0 {
				continue
			}
			if !rg.Aligned(bits) {
				return fmt.Errorf("pool %q's addresses %s are not whole /%d prefixes: the announced prefix would take in addresses outside the pool", pc.Name, a, bits)
			}
		}
	}
	return nil
}

// CheckAggregation reports why the hook would refuse a BGPAdvertisement
// named name of spec for its aggregation lengths (nil when it would not):
// a length out of range, one without a pool selection, or a picked pool of
// pools (with the labels of poolLabels) that is not made of whole prefixes
// of that length.
func CheckAggregation(name string, spec *v1alpha1.BGPAdvertisementSpec, pools []PoolConfig, poolLabels map[string]labels.Set) error {
	r, err := newAdRule(name, spec.PoolSelection, nil, nil, "")
	if err == nil {
		r.Route, err = bgpRouteAttrs(spec)
	}
	if err == nil {
		err = r.aggregationFits(pools, poolLabels)
	}
	return err
}
