package config

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/l2"
)

// meta names an object created age minutes after a fixed moment, so that
// tests say which is older.
func meta(name string, age int) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 1,
		CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, age, 0, 0, time.UTC))}
}

func testPool(name string, age int, addrs ...string) *v1alpha1.LoadBalancerIPPool {
	return &v1alpha1.LoadBalancerIPPool{ObjectMeta: meta(name, age), Spec: v1alpha1.LoadBalancerIPPoolSpec{Addresses: addrs}}
}

func testPeer(name string, age int, myASN int64, addr string) *v1alpha1.BGPPeer {
	return &v1alpha1.BGPPeer{ObjectMeta: meta(name, age), Spec: v1alpha1.BGPPeerSpec{MyASN: myASN, PeerASN: 64512, PeerAddress: addr}}
}

// verdictOf returns the Verdict of kind/name in c, failing t when there is
// none.
func verdictOf(t *testing.T, c Converted, kind, name string) Verdict {
	t.Helper()
	for _, v := range c.Verdicts {
		if v.Kind == kind && v.Name == name {
			return v
		}
	}
	t.Fatalf("no Verdict on %s %s in %+v", kind, name, c.Verdicts)
	return Verdict{}
}

func wantInvalid(t *testing.T, c Converted, kind, name, msg string) {
	t.Helper()
	v := verdictOf(t, c, kind, name)
	if v.Err == nil || !strings.Contains(v.Err.Error(), msg) {
		t.Errorf("%s %s: Verdict %v, want invalid with %q", kind, name, v.Err, msg)
	}
}

func poolNames(c Config) []string {
	var out []string
	for _, p := range c.Pools {
		out = append(out, p.Name)
	}
	return out
}

// Each pool is checked alone and against the older ones: the newer of two
// overlapping pools, a pool named as one of the file's and a pool of a bad
// address are left out with a reason; the rest apply, after the file's.
func TestConvertPools(t *testing.T) {
	base := Config{Pools: []PoolConfig{{Name: "file", Addresses: []string{"192.0.2.0/28"}}}}
	keep := false
	routed := testPool("routed", 1, "198.51.100.0/30")
	routed.Spec.AvoidNetworkAndBroadcast = &keep
	routed.Spec.Namespaces = []string{"payments"}
	in := Objects{Pools: []*v1alpha1.LoadBalancerIPPool{
		testPool("newer", 5, "198.51.100.2"), // overlaps routed, which is older
		routed,
		testPool("file", 2, "203.0.113.1"),
		testPool("bad", 3, "203.0.113.300"),
		testPool("v6", 4, "2001:db8::/120"),
	}}
	c, _ := Convert(base, in, Memory{})
	if got, want := poolNames(c.Config), []string{"file", "routed", "v6"}; !reflect.DeepEqual(got, want) {
		t.Errorf("pools %v, want %v", got, want)
	}
	wantInvalid(t, c, KindPool, "newer", "overlap")
	wantInvalid(t, c, KindPool, "file", "configuration file has a pool named")
	wantInvalid(t, c, KindPool, "bad", "203.0.113.300")
	for _, ok := range []string{"routed", "v6"} {
		if v := verdictOf(t, c, KindPool, ok); v.Err != nil {
			t.Errorf("pool %s: %v", ok, v.Err)
		}
	}
	if pc := c.Config.Pools[1]; !pc.KeepNetworkAndBroadcast || !reflect.DeepEqual(pc.Namespaces, []string{"payments"}) {
		t.Errorf("routed converted to %+v", pc)
	}
	if _, err := c.ForNode(nil).Parse(); err != nil {
		t.Errorf("the converted configuration does not parse: %v", err)
	}
}

// An object that turns invalid keeps its last accepted version in force,
// and says it is invalid; a deleted one is forgotten; one that was never
// valid is left out.
func TestConvertKeepsLastGood(t *testing.T) {
	p := testPool("main", 1, "192.0.2.0/28")
	c, mem := Convert(Config{}, Objects{Pools: []*v1alpha1.LoadBalancerIPPool{p}}, Memory{})
	if v := verdictOf(t, c, KindPool, "main"); v.Err != nil || v.Stale {
		t.Fatalf("Verdict %+v", v)
	}
	bad := p.DeepCopy()
	bad.Spec.Addresses = []string{"192.0.2.0/33"}
	bad.Generation = 2
	c, mem = Convert(Config{}, Objects{Pools: []*v1alpha1.LoadBalancerIPPool{bad}}, mem)
	v := verdictOf(t, c, KindPool, "main")
	if v.Err == nil || !v.Stale || v.Generation != 2 {
		t.Errorf("Verdict %+v, want invalid and stale at generation 2", v)
	}
	if len(c.Config.Pools) != 1 || !reflect.DeepEqual(c.Config.Pools[0].Addresses, []string{"192.0.2.0/28"}) {
		t.Errorf("pools %+v, want the last good main", c.Config.Pools)
	}
	// Deleted, then created again invalid under the same name: nothing
	// of the old object is remembered.
	c, mem = Convert(Config{}, Objects{}, mem)
	if len(mem.pools) != 0 || len(c.Config.Pools) != 0 {
		t.Errorf("a deleted pool is remembered: %+v, %+v", mem.pools, c.Config.Pools)
	}
	c, _ = Convert(Config{}, Objects{Pools: []*v1alpha1.LoadBalancerIPPool{bad}}, mem)
	if v := verdictOf(t, c, KindPool, "main"); v.Err == nil || v.Stale || len(c.Config.Pools) != 0 {
		t.Errorf("Verdict %+v, pools %+v: want invalid and left out", v, c.Config.Pools)
	}
}

// A peer's password comes from its Secret and stays when the Secret goes
// (the last good version); a peer whose Secret never existed is invalid.
// Peers share the node's one speaker: a newer peer of another ASN, or of
// an address already peered, is invalid.
func TestConvertPeers(t *testing.T) {
	withPW := testPeer("tor", 1, 64513, "10.0.0.1")
	withPW.Spec.PasswordSecret = &v1alpha1.SecretKeyRef{Name: "bgp", Key: "password"}
	withPW.Spec.HoldTimeSeconds = 9
	withPW.Spec.BFD = &v1alpha1.BFD{}
	withPW.Spec.GracefulRestart = &v1alpha1.GracefulRestart{}
	noSecret := testPeer("nosecret", 2, 64513, "10.0.0.2")
	noSecret.Spec.PasswordSecret = &v1alpha1.SecretKeyRef{Name: "missing", Key: "password"}
	ibgp := testPeer("ibgp", 6, 64513, "10.0.0.6")
	ibgp.Spec.PeerASN, ibgp.Spec.EBGPMultihop = 64513, 2
	second := testPeer("second", 5, 64513, "2001:db8::1")
	second.Spec.GracefulRestart = &v1alpha1.GracefulRestart{RestartTimeSeconds: 300}
	longRestart := testPeer("longrestart", 7, 64513, "10.0.0.7")
	longRestart.Spec.GracefulRestart = &v1alpha1.GracefulRestart{RestartTimeSeconds: 4096}
	in := Objects{
		Peers: []*v1alpha1.BGPPeer{withPW, noSecret, ibgp, testPeer("otherasn", 3, 64999, "10.0.0.3"),
			testPeer("again", 4, 64513, "10.0.0.1"), second, longRestart},
		Secrets: map[string]map[string][]byte{"bgp": {"password": []byte("s3cret")}},
	}
	c, mem := Convert(Config{}, in, Memory{})
	wantInvalid(t, c, KindPeer, "nosecret", `no Secret "missing"`)
	wantInvalid(t, c, KindPeer, "otherasn", "myASN 64999 differs from BGPPeer tor's 64513")
	wantInvalid(t, c, KindPeer, "again", "peer 10.0.0.1 is configured already")
	wantInvalid(t, c, KindPeer, "ibgp", "ebgpMultihop is for eBGP")
	wantInvalid(t, c, KindPeer, "longrestart", "restartTimeSeconds is out of range")
	cfg := c.ForNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	want := &bgp.Config{ASN: 64513, Peers: []bgp.Peer{
		{Address: "10.0.0.1", ASN: 64512, Password: "s3cret", HoldTimeSeconds: 9, BFD: true, GracefulRestart: true},
		{Address: "2001:db8::1", ASN: 64512, GracefulRestart: true, GracefulRestartSeconds: 300}}}
	if !reflect.DeepEqual(cfg.BGP, want) || cfg.bgpErr != nil {
		t.Errorf("bgp %+v (err %v), want %+v", cfg.BGP, cfg.bgpErr, want)
	}

	in.Secrets = nil
	c, _ = Convert(Config{}, in, mem)
	if v := verdictOf(t, c, KindPeer, "tor"); v.Err == nil || !v.Stale {
		t.Errorf("tor without its Secret: Verdict %+v, want invalid and stale", v)
	}
	if cfg := c.ForNode(nil); cfg.BGP == nil || cfg.BGP.Peers[0].Password != "s3cret" {
		t.Errorf("tor's last good password is gone: %+v", cfg.BGP)
	}

	// With the file's bgp section, peers join it and must take its ASN
	// and router settings.
	file := &bgp.Config{ASN: 64513, RouterID: "10.1.1.1", Peers: []bgp.Peer{{Address: "10.0.0.9", ASN: 64512}}}
	rid := testPeer("rid", 1, 64513, "10.0.0.1")
	rid.Spec.RouterID = &v1alpha1.NodeValue{Label: "example.net/router-id"}
	c, _ = Convert(Config{BGP: file}, Objects{Peers: []*v1alpha1.BGPPeer{rid, testPeer("dup", 2, 64513, "10.0.0.9"),
		testPeer("ok", 3, 64513, "10.0.0.5")}}, Memory{})
	wantInvalid(t, c, KindPeer, "rid", "come from the configuration file")
	wantInvalid(t, c, KindPeer, "dup", "configured already")
	if cfg := c.ForNode(nil); cfg.BGP.RouterID != "10.1.1.1" || len(cfg.BGP.Peers) != 2 || cfg.BGP.Peers[1].Address != "10.0.0.5" {
		t.Errorf("bgp %+v, want the file's with peer 10.0.0.5 added", cfg.BGP)
	}
	if len(file.Peers) != 1 {
		t.Errorf("the file's configuration was changed: %+v", file)
	}
}

// Each node peers with the routers whose nodeSelector picks it, under the
// router ID and next hops its own Node says; a node whose Node lacks them
// gets an error (BGP does not start there), the others are not affected.
func TestForNodeBGP(t *testing.T) {
	rack := testPeer("rack-a", 1, 64513, "10.0.0.1")
	rack.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}
	rack.Spec.RouterID = &v1alpha1.NodeValue{Annotation: "example.net/router-id"}
	rack.Spec.NextHopIPv6 = &v1alpha1.NodeValue{AddressType: "InternalIP"}
	other := rack.DeepCopy()
	other.ObjectMeta = meta("rack-b", 2)
	other.Spec.PeerAddress = "10.0.0.2"
	other.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "b"}}
	c, _ := Convert(Config{}, Objects{Peers: []*v1alpha1.BGPPeer{rack, other}}, Memory{})
	node := func(name, rack, rid string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"rack": rack}, Annotations: map[string]string{}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.5"},
				{Type: corev1.NodeInternalIP, Address: "2001:db8:1::5"}}}}
		if rid != "" {
			n.Annotations["example.net/router-id"] = rid
		}
		return n
	}
	a := c.ForNode(node("a1", "a", "1.1.1.1"))
	if a.BGP == nil || a.bgpErr != nil || a.BGP.RouterID != "1.1.1.1" || a.BGP.NextHopIPv6 != "2001:db8:1::5" ||
		len(a.BGP.Peers) != 1 || a.BGP.Peers[0].Address != "10.0.0.1" {
		t.Errorf("node a1: bgp %+v, err %v", a.BGP, a.bgpErr)
	}
	if b := c.ForNode(node("b1", "b", "")); b.bgpErr == nil || !strings.Contains(b.bgpErr.Error(), "annotation example.net/router-id") {
		t.Errorf("node b1 without a router ID: err %v", b.bgpErr)
	}
	if cfg := c.ForNode(node("c1", "c", "1.1.1.3")); cfg.BGP != nil {
		t.Errorf("node c1, picked by no peer, runs bgp %+v", cfg.BGP)
	}
	if cfg := c.ForNode(node("a2", "a", "2001:db8::1")); cfg.bgpErr == nil {
		t.Errorf("an IPv6 router ID was taken")
	}
}

// L2Advertisements pick the nodes that run the responder and its
// interfaces; with none, the file's l2 section applies everywhere.
func TestForNodeL2(t *testing.T) {
	base := Config{L2: &l2.Config{LeaseRenewSeconds: 2}}
	c, _ := Convert(base, Objects{}, Memory{})
	if cfg := c.ForNode(nil); !reflect.DeepEqual(cfg.L2, base.L2) {
		t.Errorf("without advertisements: l2 %+v, want the file's", cfg.L2)
	}
	a := &v1alpha1.L2Advertisement{ObjectMeta: meta("a", 1), Spec: v1alpha1.L2AdvertisementSpec{
		NodeSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"l2": "yes"}}}, Interfaces: []string{"eth1"}}}
	b := &v1alpha1.L2Advertisement{ObjectMeta: meta("b", 2), Spec: v1alpha1.L2AdvertisementSpec{InterfacePattern: "bond0\\.[0-9]+"}}
	bad := &v1alpha1.L2Advertisement{ObjectMeta: meta("bad", 3), Spec: v1alpha1.L2AdvertisementSpec{InterfacePattern: "eth("}}
	c, _ = Convert(base, Objects{L2Ads: []*v1alpha1.L2Advertisement{a, b, bad}}, Memory{})
	wantInvalid(t, c, KindL2Ad, "bad", "interfacePattern")
	on := c.ForNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"l2": "yes"}}})
	if on.L2 == nil || !reflect.DeepEqual(on.L2.Interfaces, []string{"eth1"}) || on.L2.LeaseRenewSeconds != 2 ||
		!reflect.DeepEqual(on.l2Patterns, []string{"bond0\\.[0-9]+"}) {
		t.Errorf("picked node: l2 %+v, patterns %v", on.L2, on.l2Patterns)
	}
	c, _ = Convert(base, Objects{L2Ads: []*v1alpha1.L2Advertisement{a}}, Memory{})
	if off := c.ForNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}); off.L2 != nil {
		t.Errorf("a node no advertisement picks runs l2 %+v", off.L2)
	}
}

// An advertisement picks addresses by pool name or pool labels, and
// nodes by label; one without pools picks every address, also those in no
// pool; with no advertisement of a kind, everything is announced.
func TestAnnouncer(t *testing.T) {
	blue := testPool("blue", 1, "192.0.2.0/28")
	blue.Labels = map[string]string{"color": "blue"}
	green := testPool("green", 2, "198.51.100.0/28")
	byLabel := &v1alpha1.BGPAdvertisement{ObjectMeta: meta("bylabel", 1), Spec: v1alpha1.BGPAdvertisementSpec{
		PoolSelection: v1alpha1.PoolSelection{IPAddressPoolSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"color": "blue"}}}}}}
	byName := &v1alpha1.BGPAdvertisement{ObjectMeta: meta("byname", 2), Spec: v1alpha1.BGPAdvertisementSpec{
		PoolSelection: v1alpha1.PoolSelection{IPAddressPools: []string{"green"}},
		NodeSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"edge": "yes"}}}}}
	c, _ := Convert(Config{}, Objects{Pools: []*v1alpha1.LoadBalancerIPPool{blue, green},
		BGPAds: []*v1alpha1.BGPAdvertisement{byLabel, byName}}, Memory{})
	p, err := c.ForNode(nil).Parse()
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]labels.Set{"edge": {"edge": "yes"}, "core": {}}
	an := p.Announcer(func(n string) labels.Set { return nodes[n] })
	for _, tc := range []struct {
		ip, node string
		want     bool
	}{
		{"192.0.2.1", "core", true}, {"192.0.2.1", "edge", true},
		{"198.51.100.1", "edge", true}, {"198.51.100.1", "core", false},
		{"203.0.113.9", "edge", false}, // in no pool, and every advertisement names pools
	} {
		if got := an.BGPAllows(netip.MustParseAddr(tc.ip), tc.node); got != tc.want {
			t.Errorf("bgp %s from %s: %v, want %v", tc.ip, tc.node, got, tc.want)
		}
		if !an.L2Allows(netip.MustParseAddr(tc.ip), tc.node) {
			t.Errorf("l2 %s from %s refused without any L2Advertisement", tc.ip, tc.node)
		}
	}
}

// A BGPAdvertisement's attributes go on the routes of the addresses it
// picks: aggregated to its prefix lengths, with its communities and
// LOCAL_PREF; two advertisements of one address give two routes, one per
// prefix. An aggregation that a picked pool is not made of whole prefixes
// of, or that picks addresses outside pools, is Invalid and leaves the
// last good version (here: none) in force; bad communities likewise.
func TestBGPRouteAttributes(t *testing.T) {
	aligned := testPool("aligned", 1, "192.0.2.0/26", "2001:db8:1::/120")
	ragged := testPool("ragged", 2, "198.51.100.1-198.51.100.62")
	lp := uint32(200)
	agg := func(name string, age int, l4, l6 int32, pools ...string) *v1alpha1.BGPAdvertisement {
		return &v1alpha1.BGPAdvertisement{ObjectMeta: meta(name, age), Spec: v1alpha1.BGPAdvertisementSpec{
			PoolSelection: v1alpha1.PoolSelection{IPAddressPools: pools}, AggregationLength: &l4, AggregationLengthV6: &l6}}
	}
	tagged := &v1alpha1.BGPAdvertisement{ObjectMeta: meta("tagged", 1), Spec: v1alpha1.BGPAdvertisementSpec{
		PoolSelection: v1alpha1.PoolSelection{IPAddressPools: []string{"aligned", "ragged"}},
		LocalPref:     &lp, Communities: []string{"65000:100", "no-export", "large:64512:1:2", "65000:100"}}}
	ads := []*v1alpha1.BGPAdvertisement{
		tagged,
		agg("wide", 2, 26, 120, "aligned"),
		agg("toowide", 3, 24, 128, "aligned"),
		agg("ragged", 4, 26, 128, "ragged"),
		agg("nopools", 5, 26, 128),
		{ObjectMeta: meta("badcommunity", 6), Spec: v1alpha1.BGPAdvertisementSpec{Communities: []string{"65536:1"}}},
	}
	c, _ := Convert(Config{}, Objects{Pools: []*v1alpha1.LoadBalancerIPPool{aligned, ragged}, BGPAds: ads}, Memory{})
	wantInvalid(t, c, KindBGPAd, "toowide", `pool "aligned"'s addresses 192.0.2.0/26 are not whole /24 prefixes`)
	wantInvalid(t, c, KindBGPAd, "ragged", `pool "ragged"'s addresses 198.51.100.1-198.51.100.62 are not whole /26 prefixes`)
	wantInvalid(t, c, KindBGPAd, "nopools", "aggregationLength needs ipAddressPools")
	wantInvalid(t, c, KindBGPAd, "badcommunity", `community "65536:1"`)
	for _, ok := range []string{"tagged", "wide"} {
		if v := verdictOf(t, c, KindBGPAd, ok); v.Err != nil {
			t.Errorf("%s: %v", ok, v.Err)
		}
	}
	p, err := c.ForNode(nil).Parse()
	if err != nil {
		t.Fatal(err)
	}
	an := p.Announcer(func(string) labels.Set { return labels.Set{} })
	for _, tc := range []struct {
		ip   string
		want []string
	}{
		{"192.0.2.7", []string{
			"192.0.2.7/32 communities 65000:100,no-export,large:64512:1:2 localPref 200",
			"192.0.2.0/26",
		}},
		{"2001:db8:1::9", []string{
			"2001:db8:1::9/128 communities 65000:100,no-export,large:64512:1:2 localPref 200",
			"2001:db8:1::/120",
		}},
		{"198.51.100.9", []string{"198.51.100.9/32 communities 65000:100,no-export,large:64512:1:2 localPref 200"}},
		{"203.0.113.1", nil}, // in no pool, and every advertisement names pools
	} {
		var got []string
		for _, r := range an.BGPRoutes(netip.MustParseAddr(tc.ip), "node1") {
			got = append(got, r.String())
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("routes of %s:\n got %q\nwant %q", tc.ip, got, tc.want)
		}
	}
}
