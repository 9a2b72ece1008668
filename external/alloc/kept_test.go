package alloc

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

// An address a Service keeps after its pool shrank is in no pool, yet a
// pool-picking advertisement keeps announcing it when it picks the pool
// the Service names, or one that admits it: as a host route, even under
// an aggregating advertisement. A Service naming another pool, or one no
// picked pool admits, is not announced by it.
func TestKeptPools(t *testing.T) {
	meta := func(name string, age int) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 1,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, age, 0, 0, time.UTC))}
	}
	shrunk := &v1alpha1.LoadBalancerIPPool{ObjectMeta: meta("shrunk", 1), Spec: v1alpha1.LoadBalancerIPPoolSpec{Addresses: []string{"192.0.2.0/28"}}}
	other := &v1alpha1.LoadBalancerIPPool{ObjectMeta: meta("other", 2), Spec: v1alpha1.LoadBalancerIPPoolSpec{Addresses: []string{"198.51.100.0/28"}}}
	other.Spec.Namespaces = []string{"team-b"}
	l := int32(28)
	ad := &v1alpha1.BGPAdvertisement{ObjectMeta: meta("shrunk", 1), Spec: v1alpha1.BGPAdvertisementSpec{
		PoolSelection: v1alpha1.PoolSelection{IPAddressPools: []string{"shrunk"}}, AggregationLength: &l, Communities: []string{"1:1"}}}
	c, _ := config.Convert(config.Config{}, config.Objects{Pools: []*v1alpha1.LoadBalancerIPPool{shrunk, other},
		BGPAds: []*v1alpha1.BGPAdvertisement{ad}}, config.Memory{})
	p, err := c.ForNode(nil).Parse()
	if err != nil {
		t.Fatal(err)
	}
	lb := func(ns, name, ip string, ann map[string]string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		return s
	}
	services := []*corev1.Service{
		lb("team-a", "kept", "192.0.2.100", nil),                                                // admitted by shrunk only
		lb("team-b", "named", "192.0.2.101", map[string]string{AnnotationAddressPool: "other"}), // came from other
		lb("team-b", "inpool", "192.0.2.5", nil),
	}
	an := p.Announcer(func(string) labels.Set { return labels.Set{} })
	an.Kept = KeptPools(p, services)
	for _, tc := range []struct {
		ip   string
		want []string
	}{
		{"192.0.2.100", []string{"192.0.2.100/32 communities 1:1"}},
		{"192.0.2.101", nil},
		{"192.0.2.5", []string{"192.0.2.0/28 communities 1:1"}},
		{"203.0.113.1", nil}, // nobody's
	} {
		var got []string
		for _, r := range an.BGPRoutes(netip.MustParseAddr(tc.ip), "node1") {
			got = append(got, r.String())
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("routes of %s: got %q, want %q", tc.ip, got, tc.want)
		}
		if an.BGPAllows(netip.MustParseAddr(tc.ip), "node1") != (tc.want != nil) {
			t.Errorf("bgpAllows(%s) disagrees with its routes %q", tc.ip, got)
		}
	}
}
