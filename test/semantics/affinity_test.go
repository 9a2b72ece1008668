package semantics_test

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// askN sends n fresh requests (new source port each) and counts answers
// by pod; any failure fails the test.
func askN(t *testing.T, from, proto, addr string, n int) map[string]int {
	t.Helper()
	ctx := ctxFor(t)
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		rep, err := nsutil.Request(ctx, from, proto, addr)
		if err != nil {
			t.Fatalf("%s %s from %s: %v", proto, addr, from, err)
		}
		seen[rep.Name]++
	}
	return seen
}

// waitSticky polls until need fresh requests in a row reach one pod and
// returns that pod and the time since since.
func waitSticky(t *testing.T, from, proto, addr string, need int, since time.Time) (string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxFor(t), netns.ConvergeTimeout)
	defer cancel()
	var (
		pod         string
		streak      int
		streakStart time.Time
		last        string
	)
	for {
		at := time.Now()
		rep, err := nsutil.Request(ctx, from, proto, addr)
		switch {
		case err != nil:
			streak, last = 0, err.Error()
		case streak > 0 && rep.Name == pod:
			streak++
		default:
			pod, streak, streakStart = rep.Name, 1, at
			last = "switched to " + rep.Name
		}
		if streak >= need {
			return pod, streakStart.Sub(since)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s %s from %s: never %d answers in a row from one pod within %v; last: %s", proto, addr, from, need, netns.ConvergeTimeout, last)
		}
	}
}

// sessionAffinity: ClientIP keeps each client on one endpoint; switching it
// off at run time spreads the client again, switching it back on sticks.
func testAffinity(t *testing.T, c *netns.Cluster) {
	pods := c.Pods()
	s := service("sticky", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](10800)}}
	svc, since := expose(t, c, s, netns.Ready(pods...))
	addr := hostPort(svc.Spec.ClusterIP, 80)

	for _, from := range []*netns.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[1]} {
		_, d := waitAnswer(t, from.Netns, "tcp", addr, since)
		logLatency(t, "affinity service answers "+from.Name, d)
		seen := askN(t, from.Netns, "tcp", addr, 40)
		if len(seen) != 1 {
			t.Errorf("sessionAffinity ClientIP: 40 fresh connections from %s reached %v, want one pod", from.Name, seen)
		} else {
			t.Logf("40 connections from %s all reached %v", from.Name, seen)
		}
	}

	from := c.Nodes[0].Pods[0]
	updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityNone
		s.Spec.SessionAffinityConfig = nil
	})
	d, err := netns.WaitBackends(ctxFor(t), from.Netns, "tcp", addr, pods, time.Now())
	if err != nil {
		t.Fatalf("affinity switched off: %v", err)
	}
	logLatency(t, "affinity off -> spread over all 4 endpoints", d)

	updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	})
	pod, d := waitSticky(t, from.Netns, "tcp", addr, 30, time.Now())
	logLatency(t, "affinity on again -> 30 in a row on "+pod, d)
	if seen := askN(t, from.Netns, "tcp", addr, 30); len(seen) != 1 || seen[pod] != 30 {
		t.Errorf("after switching affinity back on, 30 more connections reached %v, want all on %s", seen, pod)
	}
}
