package config

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/webhook"
)

// FuzzConfig decodes the external section of the configuration file from
// fuzzed JSON, as the agent does, and checks it as New does. Neither may
// panic, and a configuration that is accepted must work: leader-election
// timings client-go accepts, and address checks that answer.
func FuzzConfig(f *testing.F) {
	off := false
	seeds := []Config{
		{ // test/external's IPAM case
			Pools: []PoolConfig{
				{Name: "main", Addresses: []string{"192.0.2.1-192.0.2.3"}},
				{Name: "manual", Addresses: []string{"198.51.100.0/31"}, AutoAssign: &off},
			},
			LeaseNamespace: "default",
			LeaderLease: LeaseTiming{Duration: Duration{3 * time.Second},
				RenewDeadline: Duration{2 * time.Second}, RetryPeriod: Duration{250 * time.Millisecond}},
		},
		{ // test/external's L2 case
			Pools:          []PoolConfig{{Name: "lab", Addresses: []string{"10.0.0.100"}}},
			LeaseNamespace: "default",
			L2:             &l2.Config{Interfaces: []string{"eth0"}, LeaseRenewSeconds: 0.5, LeaseDurationSeconds: 1.5},
		},
		{ // test/external's BGP case
			Pools:          []PoolConfig{{Name: "lab", Addresses: []string{"10.0.0.100", "2001:db8::/64"}}},
			LeaseNamespace: "default",
			BGP:            &bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}},
		},
		{
			Pools:           []PoolConfig{{Name: "pods", Addresses: []string{"203.0.113.0/24"}, AllowPods: true, Namespaces: []string{"a"}}},
			ExternalIPCIDRs: []string{"198.51.100.0/24"},
			PodExternalIPs:  true,
			Webhook:         &webhook.Config{URL: "https://lb.example/onehop"},
		},
	}
	for _, c := range seeds {
		b, err := json.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"leaderLease":{"duration":"1ns"}}`))
	f.Add([]byte(`{"leaderLease":{"duration":30,"renewDeadline":"20s","retryPeriod":19.5}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Config
		if json.Unmarshal(data, &c) != nil {
			return
		}
		p, err := c.Parse()
		if err != nil {
			return
		}
		if p.BGP != nil {
			_ = p.BGP.Validate()
		}
		// client-go's leader election refuses these (leaderelection.NewLeaderElector).
		lt := p.LeaderLease
		if lt.Duration.Duration <= lt.RenewDeadline.Duration || lt.RenewDeadline.Duration <= time.Duration(1.2*float64(lt.RetryPeriod.Duration)) ||
			lt.RetryPeriod.Duration <= 0 {
			t.Errorf("accepted leader-election timings %v/%v/%v, which leader election refuses",
				lt.Duration, lt.RenewDeadline, lt.RetryPeriod)
		}
		if p.LeaseNamespace == "" {
			t.Error("no lease namespace")
		}
		for _, a := range []string{"192.0.2.1", "203.0.113.7", "2001:db8::1", "::ffff:192.0.2.1", "0.0.0.0"} {
			ip := netip.MustParseAddr(a)
			p.ExternalIPAllowed(ip)
			p.PodIPRefused(ip, "a")
		}
	})
}
