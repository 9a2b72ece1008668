package alloc

import (
	"context"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/internal/hooktest"
)

// MetalLB's annotations mean what onehop's do; onehop's win, and the newer
// metallb.io spelling wins over metallb.universe.tf.
func TestMetalLBAnnotationAliases(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ann        map[string]string
		ips        []string
		pool, key  string
		overridden []string
		err        string
	}{
		{name: "metallb.io alone",
			ann: map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.1,2001:db8::1", "metallb.io/address-pool": "p", "metallb.io/allow-shared-ip": "k"},
			ips: []string{"192.0.2.1", "2001:db8::1"}, pool: "p", key: "k"},
		{name: "metallb.universe.tf alone",
			ann: map[string]string{"metallb.universe.tf/loadBalancerIPs": "192.0.2.2", "metallb.universe.tf/address-pool": "old", "metallb.universe.tf/allow-shared-ip": "k2"},
			ips: []string{"192.0.2.2"}, pool: "old", key: "k2"},
		{name: "onehop's wins",
			ann: map[string]string{AnnotationLoadBalancerIPs: "192.0.2.3", "metallb.io/loadBalancerIPs": "192.0.2.4",
				AnnotationAddressPool: "mine", "metallb.io/address-pool": "theirs", "metallb.universe.tf/address-pool": "mine"},
			ips: []string{"192.0.2.3"}, pool: "mine",
			overridden: []string{
				`annotation metallb.io/loadBalancerIPs="192.0.2.4" is ignored: onehop.io/load-balancer-ips="192.0.2.3" wins`,
				`annotation metallb.io/address-pool="theirs" is ignored: onehop.io/address-pool="mine" wins`,
			}},
		{name: "agreeing up to spaces is no conflict",
			ann: map[string]string{AnnotationLoadBalancerIPs: "192.0.2.5, 2001:db8::5", "metallb.io/loadBalancerIPs": "192.0.2.5,2001:db8::5",
				AnnotationAllowSharedIP: "k", "metallb.io/allow-shared-ip": " k "},
			ips: []string{"192.0.2.5", "2001:db8::5"}, key: "k"},
		{name: "metallb.io over metallb.universe.tf",
			ann:        map[string]string{"metallb.io/allow-shared-ip": "new", "metallb.universe.tf/allow-shared-ip": "old"},
			key:        "new",
			overridden: []string{`annotation metallb.universe.tf/allow-shared-ip="old" is ignored: metallb.io/allow-shared-ip="new" wins`}},
		{name: "a bad alias is named in the error",
			ann: map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.300"},
			err: "annotation metallb.io/loadBalancerIPs: "},
		{name: "an empty alias is an error, as onehop's is",
			ann: map[string]string{"metallb.io/loadBalancerIPs": " , "},
			err: "annotation metallb.io/loadBalancerIPs is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := hooktest.LBService("x", false)
			s.Annotations = tc.ann
			req, err := RequestFor(s)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ips []string
			for _, a := range req.Requested {
				ips = append(ips, a.String())
			}
			if !slices.Equal(ips, tc.ips) || req.Pool != tc.pool || req.SharingKey != tc.key {
				t.Errorf("requested %v pool %q key %q, want %v %q %q", ips, req.Pool, req.SharingKey, tc.ips, tc.pool, tc.key)
			}
			if got := overriddenAliases(s); !slices.Equal(got, tc.overridden) {
				t.Errorf("overridden:\n got %q\nwant %q", got, tc.overridden)
			}
		})
	}
}

// The allocator tells a Service whose MetalLB annotation it ignores, and
// allocates what onehop's annotation asks.
func TestAllocatorEventsOverriddenAlias(t *testing.T) {
	s := hooktest.LBService("web", false)
	s.Annotations = map[string]string{AnnotationLoadBalancerIPs: "192.0.2.10", "metallb.io/loadBalancerIPs": "192.0.2.11"}
	a, client, _, rec := testAllocator(t, "192.0.2.0/24", s)
	if err := a.sync(context.Background(), KeyOf(s)); err != nil {
		t.Fatal(err)
	}
	events := hooktest.Drain(rec)
	want := []string{
		`Warning AnnotationIgnored annotation metallb.io/loadBalancerIPs="192.0.2.11" is ignored: onehop.io/load-balancer-ips="192.0.2.10" wins`,
		"Normal IPAllocated load-balancer IPs [192.0.2.10]",
	}
	if !slices.Equal(events, want) {
		t.Errorf("events:\n got %q\nwant %q", events, want)
	}
	got, err := client.CoreV1().Services(s.Namespace).Get(context.Background(), s.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ips := StatusIPs(got); len(ips) != 1 || ips[0].String() != "192.0.2.10" {
		t.Errorf("status %v, want [192.0.2.10]", ips)
	}
}

func TestRequestFor(t *testing.T) {
	s := hooktest.LBService("x", false)
	s.Annotations = map[string]string{AnnotationLoadBalancerIPs: "192.0.2.1, 2001:db8::1", AnnotationAllowSharedIP: "k", AnnotationAddressPool: "p"}
	s.Spec.LoadBalancerIP = "192.0.2.99" // the annotation wins
	req, err := RequestFor(s)
	if err != nil || len(req.Requested) != 2 || req.SharingKey != "k" || req.Pool != "p" || req.Requested[0].String() != "192.0.2.1" {
		t.Errorf("got %+v, %v", req, err)
	}
	s.Annotations = map[string]string{AnnotationLoadBalancerIPs: "192.0.2.300"}
	if _, err := RequestFor(s); err == nil {
		t.Error("bad annotation accepted")
	}
	s.Annotations = nil
	if req, err := RequestFor(s); err != nil || len(req.Requested) != 1 || req.Requested[0].String() != "192.0.2.99" {
		t.Errorf("spec.loadBalancerIP: got %+v, %v", req, err)
	}
}
