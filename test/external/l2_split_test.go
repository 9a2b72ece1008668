package external

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
)

// TestL2SplitNodesOwnTheirLeases: the L2 provider as deploy/ ships it. A
// controller allocates the VIP; each node agent, with its pod's identity
// under deploy/base's RBAC and admission policy, creates and renews its own
// liveness Lease in onehop-leases, and the owner answers for the VIP. The
// owner's agent then stops cleanly: it deletes its own Lease (allowed by
// the policy) and the other node takes the VIP over at once, well before
// the Lease would have expired. Any refused request fails the test.
func TestL2SplitNodesOwnTheirLeases(t *testing.T) {
	lab := newL2Lab(t)
	cp, c := lab.twoNodeCluster("sw")
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}},
		// A long Lease: a takeover within it can only come from the
		// stopping agent deleting its own.
		L2: &l2.Config{Interfaces: []string{"eth0"}, LeaseRenewSeconds: 1, LeaseDurationSeconds: 30},
	})
	sp.runController(cfg, "onehop-controller-0", "")
	agents := map[string]*exec.Cmd{}
	for _, n := range []string{"node1", "node2"} {
		agents[n] = sp.startNodeAgent(lab, n, cfg)
	}
	createLB(t, c, "web", 80)
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})

	leases := c.CoordinationV1().Leases(splitLeaseNamespace)
	renewed := map[string]string{}
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		for _, n := range []string{"node1", "node2"} {
			l, err := leases.Get(context.Background(), "onehop-l2-"+n, metav1.GetOptions{})
			if err != nil {
				return false
			}
			if renewed[n] == "" {
				renewed[n] = l.ResourceVersion
			}
			if l.ResourceVersion == renewed[n] {
				return false // created; wait for a renewal
			}
		}
		return true
	}); !ok {
		t.Fatalf("the node agents did not create and renew their own Leases (first seen at resourceVersions %v)", renewed)
	}

	owner := l2.Owner(netip4(vip), []string{"node1", "node2"})
	other := map[string]string{"node1": "node2", "node2": "node1"}[owner]
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	var got string
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		got, _ = lab.get("client", vip+":80")
		return got == pod[owner]
	}); !ok {
		t.Fatalf("client -> %s: %q, want %s (owner %s)", vip, got, pod[owner], owner)
	}

	t0 := time.Now()
	_ = agents[owner].Process.Signal(syscall.SIGTERM)
	if _, ok := waitFor(context.Background(), 10*time.Second, func() bool {
		_, err := leases.Get(context.Background(), "onehop-l2-"+owner, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}); !ok {
		t.Fatalf("%s's agent stopped but its Lease is still there", owner)
	}
	want := lab.mac(other, "eth0")
	if _, ok := waitFor(context.Background(), 10*time.Second, func() bool { return lab.neigh(vip) == want }); !ok {
		t.Fatalf("no takeover after %s's clean stop: client's entry for %s is %q, want %s's %s", owner, vip, lab.neigh(vip), other, want)
	}
	t.Logf("clean stop of %s: Lease deleted, client moved to %s after %v (Lease duration 30 s)", owner, other, time.Since(t0).Round(time.Millisecond))
	if got, err := lab.get("client", vip+":80"); err != nil || got != pod[other] {
		t.Fatalf("after the clean stop: %q, %v; want %s", got, err, pod[other])
	}
	if _, err := leases.Get(context.Background(), "onehop-l2-"+other, metav1.GetOptions{}); err != nil {
		t.Errorf("%s's Lease: %v", other, err)
	}
}
