package ipvs

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/onehop/onehop/test/nsutil"
)

// slice6 is slice's IPv6 twin: the pods' IPv6 addresses.
func slice6(name string, pods ...int) *discovery.EndpointSlice {
	es := slice(name, pods...)
	es.Name, es.AddressType = name+"-6", discovery.AddressTypeIPv6
	for i, p := range pods {
		es.Endpoints[i].Addresses = []string{podIP6(p)}
	}
	return es
}

// TestServiceIPsOnlyServicePorts: a listener of the node's own on a port
// no Service has (as a kubelet on :10250) is not reachable through a
// cluster IP or a load-balancer IP, over TCP or UDP, in either family, from
// outside, from a pod or from the node itself; the Service's port on the
// same IPs is served.
func TestServiceIPsOnlyServicePorts(t *testing.T) {
	n := newTestNet(t, 2)
	node, err := nsutil.ServeEcho(n.node, "node", []int{10250}, []int{10250}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	const cip, cip6, lbIP = "10.96.4.10", "fd00:96::4:10", "203.0.113.20"
	a := n.startAgent(service("web", cip, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ClusterIPs = []string{cip, cip6}
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		s.Spec.Ports[0].NodePort = 30110
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: lbIP}}
	}), slice("web", 1, 2), slice6("web", 1, 2))
	a.waitSynced()

	froms := map[string]string{"outside": n.client, "a pod": n.pods[0], "the node": n.node}
	for _, ip := range []string{cip, lbIP, cip6} {
		for from, ns := range froms {
			if ip == lbIP && from == "a pod" {
				continue // the same path as outside
			}
			svc := net.JoinHostPort(ip, "80")
			if c, err := n.dial(ns, svc); err != nil {
				t.Errorf("from %s, the Service at %s: %v", from, svc, err)
			} else {
				c.Close()
			}
			// Refused, not lost: a datagram the node's socket took may get
			// no answer the client accepts (it comes from another address).
			other := net.JoinHostPort(ip, "10250")
			if c, err := n.dial(ns, other); err == nil {
				c.Close()
				t.Errorf("from %s, TCP %s reached %s: the node's own listener through a Service IP", from, other, c.Pod)
			} else if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("from %s, TCP %s: %v, want connection refused", from, other, err)
			}
			// An ICMP error may be lost on a loaded machine: a datagram
			// that got no answer at all is sent again, twice at most.
			for try := 1; ; try++ {
				pod, _, err := n.udp(ns, other)
				if err == nil {
					t.Errorf("from %s, UDP %s reached %s: the node's own listener through a Service IP", from, other, pod)
				} else if !errors.Is(err, syscall.ECONNREFUSED) {
					if errors.Is(err, os.ErrDeadlineExceeded) && try < 3 {
						continue
					}
					t.Errorf("from %s, UDP %s: %v, want connection refused", from, other, err)
				}
				break
			}
		}
	}
	// The node's listener itself is still there, on the node's address.
	if r, err := nsutil.Request(context.Background(), n.client, "tcp", net.JoinHostPort(nodeIP, "10250")); err != nil || r.Name != "node" {
		t.Errorf("the node's listener on its own address: %q %v", r.Name, err)
	}
	t.Log(a.b.dump().Raw)
}
