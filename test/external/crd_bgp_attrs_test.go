package external

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

// internalPeering makes the lab's BIRD an internal peer of both nodes (AS
// 64512 on both sides, so that LOCAL_PREF is sent: external peers never
// see it) that takes IPv4 prefixes of 203.0.113.0/24 from /24 to /32,
// with the nodes as direct next hops, and reloads it.
func (lab *bgpLab) internalPeering(t *testing.T) {
	t.Helper()
	lab.reconfigure(t, [][2]string{
		{"as 64513;", "as 64512;"},
		{"passive yes;", "passive yes; direct;"}, // BIRD takes an internal peer for multihop otherwise
		{"ipv4 { import filter { if net ~ [ 203.0.113.0/24{32,32} ]", "ipv4 { gateway direct; import filter { if net ~ [ 203.0.113.0/24{24,32} ]"},
	}, "")
}

// routeAttrs waits until BIRD's route to prefix carries every one of
// want (lines of `birdc show route all`) and returns what it showed.
func (lab *bgpLab) routeAttrs(t *testing.T, prefix, what string, want ...string) string {
	t.Helper()
	var out string
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		out = lab.birdc("show", "route", "all", prefix)
		for _, w := range want {
			if !strings.Contains(out, w) {
				return false
			}
		}
		return true
	}); !ok {
		t.Fatalf("%s: BIRD's route to %s lacks one of %q:\n%s", what, prefix, want, out)
	}
	return out
}

// TestCRDBGPAdvertisementAttributes: a BGPAdvertisement's aggregation
// length, communities and LOCAL_PREF reach a real router (BIRD, an
// internal peer): both nodes announce the pool's /26 with them, and a
// client reaches the Service's address through it; a second Service's
// address in the /26 is a second announced IP on the same prefix. Changed, without a
// restart, the advertisement replaces the /26 by the address's own /32
// with the new community; an aggregation the pool does not fit is Invalid
// and the routes stay as they were. A pool shrunk under the Service's
// address leaves it announced.
func TestCRDBGPAdvertisementAttributes(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	lab.internalPeering(t)

	t.Setenv("OHX_MODEL", "1") // the agents serve what their own model programs: both Services
	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{CRDs: true})
	sp.runAll(lab.topo, cfg)
	const agg = "203.0.113.0/26"
	cr.apply(v1alpha1.LoadBalancerIPPools, "lab", `{addresses: ["`+agg+`"]}`)
	cr.apply(v1alpha1.BGPPeers, "router", `{myASN: 64512, peerASN: 64512, peerAddress: 10.0.0.1, holdTimeSeconds: 9}`)
	cr.apply(v1alpha1.BGPAdvertisements, "tagged",
		`{ipAddressPools: [lab], aggregationLength: 26, localPref: 250, communities: ["65000:100", no-export, "large:64512:1:2"]}`)
	cr.accepted(v1alpha1.BGPAdvertisements, "tagged", "True", "in force")

	createLB(t, c, "web", 80, func(s *corev1.Service) {
		s.Annotations = map[string]string{alloc.AnnotationLoadBalancerIPs: vip}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	lab.waitHopsFor(t, agg, "both nodes announce the aggregate", "10.0.0.11", "10.0.0.12")
	lab.routeAttrs(t, agg, "the aggregate's attributes",
		"BGP.local_pref: 250", "BGP.community: (65000,100) (65535,65281)", "BGP.large_community: (64512, 1, 2)")
	if hops := lab.nextHopsFor(vip); len(hops) > 0 {
		t.Errorf("the router has a host route to %s via %v beside the aggregate", vip, hops)
	}
	if got, err := lab.get("client", vip+":80"); err != nil || !strings.HasPrefix(got, "pod") {
		t.Fatalf("client -> %s through the aggregate: %q, %v", vip, got, err)
	}

	// A second address in the /26 rides the same route: two IPs, one
	// prefix.
	createLB(t, c, "api", 80, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	lbIPs(t, c, "api", "allocation", some)
	setEndpoints(t, c, "api", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	for _, n := range []string{"node1", "node2"} {
		sp.waitNodeMetric(t, n, `onehop_announced_ips{provider="bgp"}`, "2")
		sp.waitNodeMetric(t, n, `onehop_bgp_announced_prefixes_total{peer="10.0.0.1"}`, "1")
	}
	if err := c.CoreV1().Services("default").Delete(context.Background(), "api", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	cr.apply(v1alpha1.BGPAdvertisements, "tagged", `{ipAddressPools: [lab], communities: ["65000:200"]}`)
	cr.accepted(v1alpha1.BGPAdvertisements, "tagged", "True", "in force")
	lab.waitHopsFor(t, vip, "the address alone, once the aggregation is gone", "10.0.0.11", "10.0.0.12")
	lab.waitHopsFor(t, agg, "the aggregate is withdrawn")
	lab.routeAttrs(t, vip+"/32", "the host route's attributes", "BGP.community: (65000,200)", "BGP.local_pref: 100")

	cr.apply(v1alpha1.BGPAdvertisements, "tagged", `{ipAddressPools: [lab], aggregationLength: 24, communities: ["65000:300"]}`)
	cr.accepted(v1alpha1.BGPAdvertisements, "tagged", "False", `pool "lab"'s addresses `+agg+` are not whole /24 prefixes`)
	time.Sleep(2 * time.Second) // what a wrongly applied change would have needed to reach BIRD
	if out := lab.routeAttrs(t, vip+"/32", "the last good advertisement stays", "BGP.community: (65000,200)"); strings.Contains(out, "65000,300") {
		t.Errorf("the invalid advertisement's community reached BIRD:\n%s", out)
	}
	lab.waitHopsFor(t, vip, "the last good advertisement stays", "10.0.0.11", "10.0.0.12")

	// The pool shrinks under web's address: web keeps it (an event says
	// so), and the advertisement of the pool it came from keeps
	// announcing it.
	cr.apply(v1alpha1.LoadBalancerIPPools, "lab", `{addresses: ["203.0.113.32/27"]}`)
	eventSaying(t, c, "default", "web", "IPOutsidePools", vip)
	time.Sleep(2 * time.Second) // what a withdrawal would have needed to reach BIRD
	lab.waitHopsFor(t, vip, "an address kept outside the shrunk pool stays announced", "10.0.0.11", "10.0.0.12")
	lab.routeAttrs(t, vip+"/32", "the kept address's route", "BGP.community: (65000,200)")
}
