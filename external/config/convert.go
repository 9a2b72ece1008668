package external

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

// crdObjects are the cloud hook's custom resources as listed, and the
// Secrets of the lease namespace (BGP passwords, the webhook's key) and its
// ConfigMaps (the webhook's CA): name -> key -> value.
type crdObjects struct {
	pools      []*v1alpha1.LoadBalancerIPPool
	peers      []*v1alpha1.BGPPeer
	bgpAds     []*v1alpha1.BGPAdvertisement
	l2Ads      []*v1alpha1.L2Advertisement
	webhooks   []*v1alpha1.LoadBalancerWebhook
	secrets    map[string]map[string][]byte
	configMaps map[string]map[string][]byte
}

// Kinds as verdicts name them.
const (
	kindPool  = "LoadBalancerIPPool"
	kindPeer  = "BGPPeer"
	kindBGPAd = "BGPAdvertisement"
	kindL2Ad  = "L2Advertisement"
	// kindWebhook is read by the cluster-wide part alone.
	kindWebhook = "LoadBalancerWebhook"
)

// verdict says whether one object is in force.
type verdict struct {
	kind, name string
	uid        types.UID
	generation int64
	// err is nil when the object is accepted; otherwise why not.
	err error
	// stale: the object is invalid, and its last accepted version is in
	// force instead.
	stale bool
	// note adds to an accepted object's message.
	note string
}

// crdMemory is the last accepted version of every object, by UID: an
// object that turns invalid keeps that version in force. A peer's is kept
// with its password, so that a deleted Secret does not drop a session.
type crdMemory struct {
	pools  map[types.UID]PoolConfig
	peers  map[types.UID]peerRule
	bgpAds map[types.UID]adRule
	l2Ads  map[types.UID]adRule
	// webhooks are kept with their key, as peers with their password.
	webhooks map[types.UID]webhookRule
}

// crdConfig is what the custom resources make of the bootstrap
// configuration, before any node's part (forNode) is picked.
type crdConfig struct {
	// cfg is the bootstrap configuration with the accepted pools after
	// its own.
	cfg Config
	// peers are the accepted BGP peers, oldest first.
	peers []peerRule
	// ads are the accepted advertisements.
	ads adRules
	// verdicts has one entry per object, in the order of crdObjects.
	verdicts []verdict
	// passwords are the values the BGPPeers name (bgpPasswords): what
	// the controller of a split install publishes to the node agents.
	passwords map[string]map[string][]byte
}

// peerRule is an accepted BGPPeer: the peer as the speaker takes it, and
// the nodes and per-node settings it comes with.
type peerRule struct {
	name  string
	asn   uint32
	peer  bgp.Peer
	nodes labels.Selector // nil: every node
	// routerID and the next hops come from each node (forNode).
	routerID, nextHop4, nextHop6 *v1alpha1.NodeValue
}

// convertCRDs adds the custom resources in to base, the file's external
// section. Each object is checked alone and against those before it,
// oldest first (so that a new object never invalidates an older one): an
// invalid object is left out, or replaced by its last accepted version in
// mem, and the others apply. It returns the memory of this round, which
// forgets deleted objects.
func convertCRDs(base Config, in crdObjects, mem crdMemory) (crdConfig, crdMemory) {
	out := crdConfig{cfg: base}
	out.cfg.Pools = slices.Clone(base.Pools)
	next := crdMemory{pools: map[types.UID]PoolConfig{}, peers: map[types.UID]peerRule{},
		bgpAds: map[types.UID]adRule{}, l2Ads: map[types.UID]adRule{}, webhooks: map[types.UID]webhookRule{}}

	// Pools: unique names (the file's own come first), no overlap.
	var pools []ipam.Pool
	names := map[string]bool{}
	for _, pc := range base.Pools {
		names[pc.Name] = true
		if p, err := pc.pool(); err == nil {
			pools = append(pools, p)
		}
	}
	for _, o := range oldestFirst(in.pools) {
		v := verdict{kind: kindPool, name: o.Name, uid: o.UID, generation: o.Generation}
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
			out.cfg.Pools = append(out.cfg.Pools, pc)
			return nil
		}
		if pc, ok := decide(&v, poolConfig(o), nil, mem.pools, try); ok {
			next.pools[o.UID] = pc
		}
		out.verdicts = append(out.verdicts, v)
	}
	out.ads.poolLabels = map[string]labels.Set{}
	for _, o := range in.pools {
		out.ads.poolLabels[o.Name] = labels.Set(o.Labels)
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
	for _, o := range oldestFirst(in.peers) {
		v := verdict{kind: kindPeer, name: o.Name, uid: o.UID, generation: o.Generation}
		try := func(r peerRule) error {
			if err := r.agrees(base.BGP, out.peers); err != nil {
				return err
			}
			a := netip.MustParseAddr(r.peer.Address)
			if addrs[a] {
				return fmt.Errorf("peer %s is configured already (by the configuration file or an older BGPPeer)", a)
			}
			addrs[a] = true
			out.peers = append(out.peers, r)
			return nil
		}
		r, err := resolvePeer(o, passwords)
		if ref := o.Spec.PasswordSecret; ref != nil && webhookKeys[*ref] != "" {
			err = webhookKeyError(*ref, webhookKeys[*ref])
		}
		if r, ok := decide(&v, r, err, mem.peers, try); ok {
			next.peers[o.UID] = r
		}
		out.verdicts = append(out.verdicts, v)
	}

	for _, o := range oldestFirst(in.bgpAds) {
		v := verdict{kind: kindBGPAd, name: o.Name, uid: o.UID, generation: o.Generation}
		r, err := newAdRule(o.Name, o.Spec.PoolSelection, o.Spec.NodeSelectors, nil, "")
		if err == nil {
			r.route, err = bgpRouteAttrs(&o.Spec)
		}
		try := func(r adRule) error {
			if err := r.aggregationFits(out.cfg.Pools, out.ads.poolLabels); err != nil {
				return fmt.Errorf("aggregation: %w", err)
			}
			out.ads.bgp = append(out.ads.bgp, r)
			return nil
		}
		if r, ok := decide(&v, r, err, mem.bgpAds, try); ok {
			next.bgpAds[o.UID] = r
		}
		out.verdicts = append(out.verdicts, v)
	}
	for _, o := range oldestFirst(in.l2Ads) {
		v := verdict{kind: kindL2Ad, name: o.Name, uid: o.UID, generation: o.Generation}
		r, err := newAdRule(o.Name, o.Spec.PoolSelection, o.Spec.NodeSelectors, o.Spec.Interfaces, o.Spec.InterfacePattern)
		try := func(r adRule) error { out.ads.l2 = append(out.ads.l2, r); return nil }
		if r, ok := decide(&v, r, err, mem.l2Ads, try); ok {
			next.l2Ads[o.UID] = r
		}
		out.verdicts = append(out.verdicts, v)
	}
	out.addWebhooks(base, in, mem, next)
	return out, next
}

// decide tries an object's current version (unless it did not even
// convert: convErr), then its last accepted one; it fills v and returns
// the version in force, if any.
func decide[T any](v *verdict, cur T, convErr error, last map[types.UID]T, try func(T) error) (T, bool) {
	err := convErr
	if err == nil {
		if err = try(cur); err == nil {
			return cur, true
		}
	}
	v.err = err
	if prev, ok := last[v.uid]; ok && try(prev) == nil {
		v.stale = true
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
func resolvePeer(o *v1alpha1.BGPPeer, secrets map[string]map[string][]byte) (peerRule, error) {
	s := o.Spec
	r := peerRule{name: o.Name, routerID: s.RouterID, nextHop4: s.NextHopIPv4, nextHop6: s.NextHopIPv6}
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
func (r peerRule) agrees(file *bgp.Config, accepted []peerRule) error {
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
func newAdRule(name string, ps v1alpha1.PoolSelection, nodes []metav1.LabelSelector, ifaces []string, pattern string) (adRule, error) {
	r := adRule{name: name, pools: ps.IPAddressPools, interfaces: ifaces}
	for i := range ps.IPAddressPoolSelectors {
		sel, err := metav1.LabelSelectorAsSelector(&ps.IPAddressPoolSelectors[i])
		if err != nil {
			return r, fmt.Errorf("ipAddressPoolSelectors[%d]: %w", i, err)
		}
		r.poolSel = append(r.poolSel, sel)
	}
	for i := range nodes {
		sel, err := metav1.LabelSelectorAsSelector(&nodes[i])
		if err != nil {
			return r, fmt.Errorf("nodeSelectors[%d]: %w", i, err)
		}
		r.nodes = append(r.nodes, sel)
	}
	if pattern != "" {
		if _, err := regexp.Compile("^(?:" + pattern + ")$"); err != nil {
			return r, fmt.Errorf("interfacePattern: %w", err)
		}
		r.pattern = pattern
	}
	return r, nil
}

// bgpRouteAttrs checks a BGPAdvertisement's route attributes.
func bgpRouteAttrs(spec *v1alpha1.BGPAdvertisementSpec) (routeAttrs, error) {
	var r routeAttrs
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
func (r *adRule) aggregationFits(pools []PoolConfig, poolLabels map[string]labels.Set) error {
	if !r.route.aggregates() {
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
			bits := r.route.agg4
			if rg.First.Is6() {
				bits = r.route.agg6
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
