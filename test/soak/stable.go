package soak

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// target is one way into a stable Service that the request loop asks.
type target struct {
	name  string // e.g. "stable-tcp cluster IP"
	proto string // tcp or udp
	addr  string
	pods  map[string]bool // the pods that may answer
}

// stableServices creates the Services the churn never touches, each with
// fixed endpoints, and returns the ways in the loop asks: a TCP and a UDP
// cluster IP, and a TCP node port on the client's node.
func stableServices(ctx context.Context, c *netns.Cluster, client *netns.Pod) ([]target, error) {
	pods := c.Pods()
	others := func(every int, from int) []*netns.Pod {
		var out []*netns.Pod
		for i := from; i < len(pods); i += every {
			if pods[i] != client {
				out = append(out, pods[i])
			}
		}
		return out
	}
	specs := []struct {
		name     string
		typ      v1.ServiceType
		proto    v1.Protocol
		port     int32
		target   int
		pods     []*netns.Pod
		nodePort bool
	}{
		{"stable-tcp", v1.ServiceTypeClusterIP, v1.ProtocolTCP, 80, netns.PortHTTP, others(2, 1), false},
		{"stable-udp", v1.ServiceTypeClusterIP, v1.ProtocolUDP, 53, netns.PortDNS, others(3, 2), false},
		{"stable-nodeport", v1.ServiceTypeNodePort, v1.ProtocolTCP, 81, netns.PortAlt, others(2, 0), true},
	}
	var out []target
	for _, s := range specs {
		svc, err := c.CreateService(ctx, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name},
			Spec: v1.ServiceSpec{Type: s.typ, Ports: []v1.ServicePort{{
				Name: "p", Protocol: s.proto, Port: s.port, TargetPort: intstr.FromInt(s.target)}}},
		})
		if err != nil {
			return nil, err
		}
		if err := c.SetEndpoints(ctx, svc, netns.Ready(s.pods...)); err != nil {
			return nil, err
		}
		t := target{name: s.name + " cluster IP", proto: map[v1.Protocol]string{v1.ProtocolTCP: "tcp", v1.ProtocolUDP: "udp"}[s.proto],
			addr: net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(s.port))), pods: map[string]bool{}}
		if s.nodePort {
			t.name = s.name + " node port"
			t.addr = net.JoinHostPort(client.Node.IP, strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
		}
		for _, p := range s.pods {
			t.pods[p.Name] = true
		}
		out = append(out, t)
	}
	return out, nil
}

// waitServed waits until each target answers steadily from its pods.
func waitServed(ctx context.Context, from *netns.Pod, targets []target, c *netns.Cluster) error {
	for _, t := range targets {
		var want []*netns.Pod
		for _, p := range c.Pods() {
			if t.pods[p.Name] {
				want = append(want, p)
			}
		}
		if _, err := netns.WaitBackends(ctx, from.Netns, t.proto, t.addr, want, time.Now()); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
	}
	return nil
}

// maxFailuresKept bounds the failures a prober remembers to show.
const maxFailuresKept = 10

// prober asks every target, one request after the other per target, each
// on a new connection (TCP) or socket (UDP). A request fails when it gets
// no answer within nsutil.EchoTimeout (refused, reset, timed out) or is
// answered by a pod that is not an endpoint of the Service.
type prober struct {
	from     *netns.Pod
	targets  []target
	requests atomic.Int64
	failed   atomic.Int64

	mu       sync.Mutex
	failures []string
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// probeGap is the pause between two requests to one target.
const probeGap = 50 * time.Millisecond

func startProber(ctx context.Context, from *netns.Pod, targets []target) *prober {
	ctx, cancel := context.WithCancel(ctx)
	p := &prober{from: from, targets: targets, cancel: cancel}
	for _, t := range targets {
		p.wg.Go(func() {
			for ctx.Err() == nil {
				rep, err := nsutil.Request(ctx, from.Netns, t.proto, t.addr)
				if ctx.Err() != nil {
					return
				}
				if err == nil && !t.pods[rep.Name] {
					err = fmt.Errorf("answered by %s, not an endpoint", rep.Name)
				}
				p.requests.Add(1)
				if err != nil {
					p.fail(t, err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(probeGap):
				}
			}
		})
	}
	return p
}

func (p *prober) fail(t target, err error) {
	p.failed.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.failures) < maxFailuresKept {
		p.failures = append(p.failures, fmt.Sprintf("%s %s %s: %v", time.Now().Format(time.StampMilli), t.name, t.addr, err))
	}
}

// Stop ends the requests; it returns how many were sent, how many failed,
// and the first failures.
func (p *prober) Stop() (requests, failed int64, first []string) {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests.Load(), p.failed.Load(), p.failures
}
