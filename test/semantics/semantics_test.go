package semantics_test

import (
	"testing"
	"time"

	"github.com/onehop/onehop/test/netns"
)

// TestSemantics runs the Service semantics cases against one namespace
// cluster: two nodes with two pods each, real kube-apiserver, real agents.
// Latencies (API write -> traffic following) are logged, never asserted.
func TestSemantics(t *testing.T) {
	began := time.Now()
	c := netns.NewForTest(t, netns.Config{})
	t.Logf("cluster %s up in %v", c.ID, time.Since(began).Round(time.Millisecond))
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *netns.Cluster)
	}{
		{"SessionAffinity", testAffinity},
		{"ExternalTrafficPolicyLocal", testExternalLocal},
		{"HealthCheckPortBusyEvent", testHealthCheckPortBusy},
		{"TerminatingFallback", testTerminatingFallback},
		{"LoadBalancerSourceRanges", testSourceRanges},
		{"UDPEndpointCycle", testUDPCycle},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c) })
	}
	t.Logf("semantics cases took %v", time.Since(began).Round(time.Millisecond))
}
