package semantics_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
)

// Terminating endpoints serve only when no endpoint is ready, and then only
// those still serving.
func testTerminatingFallback(t *testing.T, c *netns.Cluster) {
	a, b, x := c.Nodes[0].Pods[0], c.Nodes[0].Pods[1], c.Nodes[1].Pods[0]
	from := c.Nodes[1].Pods[1]
	terminating := func(p *netns.Pod, serving bool) netns.Endpoint {
		return netns.Endpoint{Pod: p, Terminating: true, Serving: serving}
	}
	svc, _ := expose(t, c, service("draining", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), netns.Ready(a, b, x))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	steps := []struct {
		what string
		eps  []netns.Endpoint
		want []*netns.Pod
	}{
		{"all ready", netns.Ready(a, b, x), []*netns.Pod{a, b, x}},
		{"one ready, one terminating+serving, one terminating: only the ready one",
			[]netns.Endpoint{{Pod: a}, terminating(b, true), terminating(x, false)}, []*netns.Pod{a}},
		{"none ready: the terminating+serving ones, not the non-serving one",
			[]netns.Endpoint{terminating(a, true), terminating(b, true), terminating(x, false)}, []*netns.Pod{a, b}},
		{"none serving: no traffic",
			[]netns.Endpoint{terminating(a, false), terminating(b, false), terminating(x, false)}, nil},
		{"a ready one appears: it alone", []netns.Endpoint{terminating(a, true), {Pod: x}}, []*netns.Pod{x}},
	}
	for _, s := range steps {
		at := time.Now()
		if err := c.SetEndpoints(ctxFor(t), svc, s.eps); err != nil {
			t.Fatal(err)
		}
		d, err := netns.WaitBackends(ctxFor(t), from.Netns, "tcp", addr, s.want, at)
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		logLatency(t, s.what, d)
	}
}
