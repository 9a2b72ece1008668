package semantics_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func port(name string, proto v1.Protocol, p, target int) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: proto, Port: int32(p), TargetPort: intstr.FromInt32(int32(target))}
}

func service(name string, typ v1.ServiceType, ports ...v1.ServicePort) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: v1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": name},
			Ports:    ports,
		},
	}
}

// expose creates svc with endpoints eps, deletes it when the test ends, and
// returns it with the time the last API write returned.
func expose(t *testing.T, c *netns.Cluster, svc *v1.Service, eps []netns.Endpoint) (*v1.Service, time.Time) {
	t.Helper()
	ctx := ctxFor(t)
	created, err := c.CreateService(ctx, svc)
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	if err := c.SetEndpoints(ctx, created, eps); err != nil {
		t.Fatalf("endpoints of %s: %v", svc.Name, err)
	}
	t.Cleanup(func() {
		if err := c.DeleteService(context.Background(), created.Namespace, created.Name); err != nil {
			t.Logf("delete service %s: %v", created.Name, err)
		}
	})
	return created, time.Now()
}

// updateService applies mut to the current Service and writes it back.
func updateService(t *testing.T, c *netns.Cluster, svc *v1.Service, mut func(*v1.Service)) *v1.Service {
	t.Helper()
	ctx := ctxFor(t)
	for attempt := 0; ; attempt++ {
		cur, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		mut(cur)
		out, err := c.Client.CoreV1().Services(svc.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			return out
		}
		if attempt > 5 {
			t.Fatalf("update service %s: %v", svc.Name, err)
		}
	}
}

func hostPort(ip string, p int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(p))) }

func logLatency(t *testing.T, what string, d time.Duration) {
	t.Helper()
	t.Logf("latency %s: %v", what, d.Round(time.Millisecond))
}

// waitAnswer polls proto addr from namespace from until any request is
// answered and returns the time since since.
func waitAnswer(t *testing.T, from, proto, addr string, since time.Time) (nsutil.Reply, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxFor(t), netns.ConvergeTimeout)
	defer cancel()
	var last error
	for {
		rep, err := nsutil.Request(ctx, from, proto, addr)
		if err == nil {
			return rep, time.Since(since)
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("%s %s from %s: no answer within %v: %v", proto, addr, from, netns.ConvergeTimeout, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func podNames(pods []*netns.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// isDrop reports whether err is a timeout (packets dropped) rather than a
// refusal.
func isDrop(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
