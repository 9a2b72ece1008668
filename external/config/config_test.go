package config

import (
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Pod may take an address of a pool only as a Service of its namespace
// could: the pool's namespaces must admit it, and a pool that selects
// Services by label admits no Pod. Addresses in no pool need
// externalIPCIDRs.
func TestPodIPRefused(t *testing.T) {
	cfg, err := Config{
		Pools: []PoolConfig{
			{Name: "pods", Addresses: []string{"192.0.2.16/28"}, AllowPods: true},
			{Name: "payments-pods", Addresses: []string{"192.0.2.32/28", "2001:db8::/124"}, AllowPods: true, Namespaces: []string{"payments", "payments-canary"}},
			{Name: "public-pods", Addresses: []string{"192.0.2.48/28"}, AllowPods: true,
				ServiceSelectors: []metav1.LabelSelector{{}}}, // matches every label set, yet a Pod is no Service
			{Name: "lb", Addresses: []string{"192.0.2.0/28"}},
			// Inside externalIPCIDRs, without allowPods: its namespaces still rule.
			{Name: "team-b", Addresses: []string{"198.51.100.0/28"}, Namespaces: []string{"team-b"}},
		},
		ExternalIPCIDRs: []string{"198.51.100.0/24"},
	}.Parse()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ip, ns string
		why    string // a part of the refusal, "" when allowed
	}{
		{"192.0.2.17", "default", ""},
		{"192.0.2.33", "payments", ""},
		{"192.0.2.34", "payments-canary", ""},
		{"::ffff:192.0.2.35", "payments", ""},
		{"2001:db8::5", "payments", ""},
		{"192.0.2.33", "default", `pool "payments-pods", which does not serve Pods of namespace default`},
		{"2001:db8::5", "default", `pool "payments-pods"`},
		{"::ffff:192.0.2.35", "default", `pool "payments-pods"`},
		{"192.0.2.49", "default", `pool "public-pods", which serves only the Services its serviceSelectors match`},
		{"192.0.2.5", "default", "outside the allowed external IP CIDRs"},
		{"203.0.113.1", "default", "outside the allowed external IP CIDRs"},
		{"198.51.100.5", "team-b", ""},
		{"198.51.100.5", "team-a", `pool "team-b", which does not serve Pods of namespace team-a`},
		{"198.51.100.77", "team-a", ""}, // externalIPCIDRs, in no pool
	} {
		got := cfg.PodIPRefused(netip.MustParseAddr(c.ip), c.ns)
		if c.why == "" && got != "" || c.why != "" && !strings.Contains(got, c.why) {
			t.Errorf("%s for a Pod of %s: refused %q, want %q", c.ip, c.ns, got, c.why)
		}
	}
}
