package netns_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
)

// cleanTrigger makes the agents clean their conntrack tables at a known
// moment: an agent walks the table at most once a second, so changes that
// reach it within a second of a walk are cleaned together in the next one.
// A Service nobody sends to loses one of its two endpoints, which the
// agents clean at once when their last walk is more than a second old.
type cleanTrigger struct {
	c    *netns.Cluster
	svc  *v1.Service
	pods []*netns.Pod
}

func newCleanTrigger(t *testing.T, c *netns.Cluster) *cleanTrigger {
	pods := []*netns.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]}
	svc, _ := expose(t, c, udpService("udp-idle", v1.ServiceTypeClusterIP), pods)
	return &cleanTrigger{c: c, svc: svc, pods: pods}
}

func (ct *cleanTrigger) now(t *testing.T) {
	t.Helper()
	ctx := ctxFor(t)
	if err := ct.c.SetEndpoints(ctx, ct.svc, netns.Ready(ct.pods...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // more than a second since any walk
	if err := ct.c.SetEndpoints(ctx, ct.svc, netns.Ready(ct.pods[0])); err != nil {
		t.Fatal(err)
	}
}

// cleanBarrier shows that a node's agent has walked its conntrack table
// since a moment. A flow from a pod of the node runs to a Service of two
// endpoints; pass takes away the endpoint it runs to and waits until the
// flow reaches the other one, which only a walk of the table begun after
// that change makes it do. Every change the agent applied before is
// cleaned by then: a walk cleans all the changes applied since the last.
type cleanBarrier struct {
	c      *netns.Cluster
	svc    *v1.Service
	flow   *udpFlow
	remain *netns.Pod
}

func newCleanBarrier(t *testing.T, c *netns.Cluster, name string, from *netns.Pod) *cleanBarrier {
	t.Helper()
	ctx := ctxFor(t)
	var eps []*netns.Pod
	for _, n := range c.Nodes[:2] {
		if p := n.Pods[len(n.Pods)-1]; p != from {
			eps = append(eps, p)
		}
	}
	svc, since := expose(t, c, udpService(name, v1.ServiceTypeClusterIP), eps)
	vip := toClusterIP(svc)
	if _, err := netns.WaitBackends(ctx, from.Netns, "udp", vip, eps, since); err != nil {
		t.Fatal(err)
	}
	f := startServedUDPFlow(t, "to "+name, from.Netns, vip)
	gone := f.answeredBy(t, c, since)
	remain := eps[0]
	if remain == gone {
		remain = eps[1]
	}
	return &cleanBarrier{c: c, svc: svc, flow: f, remain: remain}
}

// pass returns once the agent has walked its table after now, and when.
func (b *cleanBarrier) pass(t *testing.T) time.Time {
	t.Helper()
	if err := b.c.SetEndpoints(ctxFor(t), b.svc, netns.Ready(b.remain)); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.flow.reaches(t, b.remain, time.Now()); !ok {
		t.FailNow()
	}
	return time.Now()
}
