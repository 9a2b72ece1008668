package pressure

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// expose creates a Service of type typ named name, port 80 to the pods'
// echo port over TCP, with ready endpoints on pods. It is deleted when t
// ends.
func expose(t *testing.T, c *netns.Cluster, name string, typ v1.ServiceType, pods []*netns.Pod) *v1.Service {
	t.Helper()
	ctx := ctxFor(t)
	svc, err := c.CreateService(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: v1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": name},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(netns.PortHTTP)}},
		},
	})
	if err != nil {
		t.Fatalf("create service %s: %v", name, err)
	}
	if err := c.SetEndpoints(ctx, svc, netns.Ready(pods...)); err != nil {
		t.Fatalf("endpoints of %s: %v", name, err)
	}
	t.Cleanup(func() { _ = c.DeleteService(context.Background(), svc.Namespace, svc.Name) })
	return svc
}

// clusterIP is svc's cluster IP and port, to dial.
func clusterIP(svc *v1.Service) string {
	return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
}

// requestLoop sends a request on a new connection every gap from one
// namespace to one address and counts the answers that came from the
// wanted pods and those that did not (errors and other pods).
type requestLoop struct {
	stop func()
	done chan struct{}

	mu       sync.Mutex
	ok       int
	failures []string // when and why, each
}

func startLoop(from, addr string, want []*netns.Pod, gap time.Duration) *requestLoop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &requestLoop{stop: cancel, done: make(chan struct{})}
	allowed := map[string]bool{}
	for _, p := range want {
		allowed[p.Name] = true
	}
	go func() {
		defer close(l.done)
		for ctx.Err() == nil {
			at := time.Now()
			rep, err := nsutil.Request(ctx, from, "tcp", addr)
			if ctx.Err() != nil {
				return // stopped mid-request: not an outcome
			}
			l.mu.Lock()
			switch {
			case err != nil:
				l.failures = append(l.failures, fmt.Sprintf("%s: %v", at.Format("15:04:05.000"), err))
			case !allowed[rep.Name]:
				l.failures = append(l.failures, fmt.Sprintf("%s: answered by %s", at.Format("15:04:05.000"), rep.Name))
			default:
				l.ok++
			}
			l.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(gap):
			}
		}
	}()
	return l
}

// end stops the loop and returns its counts.
func (l *requestLoop) end() (ok int, failures []string) {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.failures
}

// checkLoop ends l and fails t on any failed request.
func checkLoop(t *testing.T, what string, l *requestLoop) {
	t.Helper()
	ok, failures := l.end()
	t.Logf("%s: %d requests answered, %d failed", what, ok, len(failures))
	if len(failures) > 0 {
		t.Errorf("%s: %d of %d requests failed, first ones: %v", what, len(failures), ok+len(failures), failures[:min(len(failures), 10)])
	}
	if ok == 0 {
		t.Errorf("%s: no request was answered", what)
	}
}

// waitServed polls addr from namespace from until a request is answered by
// one of want, for at most bound, then waits for a steady streak from all
// of them; it returns the time from since to the first such answer.
func waitServed(ctx context.Context, t *testing.T, from, addr string, want []*netns.Pod, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	allowed := map[string]bool{}
	for _, p := range want {
		allowed[p.Name] = true
	}
	deadline := since.Add(bound)
	var last string
	for {
		at := time.Now()
		rep, err := nsutil.Request(ctx, from, "tcp", addr)
		switch {
		case err != nil:
			last = err.Error()
		case !allowed[rep.Name]:
			last = "answered by " + rep.Name
		default:
			d := at.Sub(since)
			if _, err := netns.WaitBackends(ctx, from, "tcp", addr, want, since); err != nil {
				t.Fatalf("%s answered once, then: %v", addr, err)
			}
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s from %s not served by the wanted pods within %v: last: %s", addr, from, bound, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// others returns the cluster's pods except skip.
func others(c *netns.Cluster, skip *netns.Pod) []*netns.Pod {
	var out []*netns.Pod
	for _, p := range c.Pods() {
		if p != skip {
			out = append(out, p)
		}
	}
	return out
}
