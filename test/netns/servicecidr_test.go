package netns_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// extraServiceCIDR is a range outside every one of the harness's plan
// (cluster.DefaultServiceCIDRs, the pod, node, client and external ranges).
const extraServiceCIDR = "10.97.0.0/24"

// TestServiceCIDRsFromTheAPI: with agents started as deploy/base starts
// them, without --service-cidr, the Service CIDRs come from the API
// server's ServiceCIDR objects, as kube-proxy reads them: a new connection
// from a pod to a port no Service defines on a cluster IP is refused, and
// one to an address of a Service CIDR that no Service holds is dropped
// (not routed on). A ServiceCIDR created at run time is covered as soon as
// the agent sees it, and no longer once deleted.
func TestServiceCIDRsFromTheAPI(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{Nodes: 1, NoServiceCIDRFlag: true})
	ctx := ctxFor(t)
	pods := c.Pods()
	from := pods[0].Netns
	// A packet the agent lets follow the routes reaches the router, which
	// has no route for it: every time, not only within ICMP's rate limit,
	// it answers "unreachable", told apart from a drop.
	for _, k := range []string{"net.ipv4.icmp_ratelimit", "net.ipv6.icmp.ratelimit"} {
		if err := nsutil.Sysctl(c.Router, k, "0"); err != nil {
			t.Fatal(err)
		}
	}

	// The default ServiceCIDR "kubernetes", which kube-apiserver creates
	// from --service-cluster-ip-range (10.96.0.0/16, fd00:96::/112).
	svc, since := expose(t, c, service("web", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), pods)
	if _, err := netns.WaitBackends(ctx, from, "tcp", hostPort(svc.Spec.ClusterIP, 80), pods, since); err != nil {
		t.Fatal(err)
	}
	unallocated := "10.96.254.254"
	if svc.Spec.ClusterIP == unallocated {
		unallocated = "10.96.254.253"
	}
	waitOutcome(ctx, t, from, hostPort(svc.Spec.ClusterIP, 81), outcomeRefused)
	waitOutcome(ctx, t, from, hostPort(unallocated, 80), outcomeDropped)
	waitOutcome(ctx, t, from, hostPort("fd00:96::fffe", 80), outcomeDropped)
	// Outside every Service CIDR the node's routes decide: the test's
	// router has no route there and says so.
	waitOutcome(ctx, t, from, "10.97.0.99:80", outcomeUnreachable)

	// A second ServiceCIDR, and a Service with a cluster IP in it.
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{extraServiceCIDR}}}
	if _, err := c.Client.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := c.Client.NetworkingV1().ServiceCIDRs().Delete(context.Background(), extra.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete ServiceCIDR %s: %v", extra.Name, err)
		}
	})
	waitOutcome(ctx, t, from, "10.97.0.99:80", outcomeDropped)

	inExtra := service("inextra", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	inExtra.Spec.ClusterIP = "10.97.0.10"
	inExtra.Spec.ClusterIPs = []string{"10.97.0.10"}
	// The API server's allocator learns the new range from its own watch.
	var created *v1.Service
	for {
		s, err := c.CreateService(ctx, inExtra.DeepCopy())
		if err == nil {
			created = s
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("a Service in %s: %v", extraServiceCIDR, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Cleanup(func() { _ = c.DeleteService(context.Background(), created.Namespace, created.Name) })
	since = time.Now()
	if err := c.SetEndpoints(ctx, created, netns.Ready(pods...)); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.WaitBackends(ctx, from, "tcp", "10.97.0.10:80", pods, since); err != nil {
		t.Fatal(err)
	}
	waitOutcome(ctx, t, from, "10.97.0.10:81", outcomeRefused)
	waitOutcome(ctx, t, from, "10.97.0.99:80", outcomeDropped)

	// Deleted (no controller-manager holds it with its finalizer), once
	// the Service in it is gone: its addresses follow the routes again.
	if err := c.DeleteService(ctx, created.Namespace, created.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.NetworkingV1().ServiceCIDRs().Delete(ctx, extra.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitOutcome(ctx, t, from, "10.97.0.99:80", outcomeUnreachable)
	waitOutcome(ctx, t, from, hostPort(unallocated, 80), outcomeDropped)
}

type connOutcome string

const (
	outcomeAnswered    connOutcome = "answered"
	outcomeRefused     connOutcome = "refused (TCP reset)"
	outcomeUnreachable connOutcome = "unreachable (ICMP from the router)"
	outcomeDropped     connOutcome = "dropped (no answer at all)"
)

// tryOutcome makes one TCP request from namespace from to addr, from source
// address src ("": the one the kernel picks).
func tryOutcome(ctx context.Context, from, src, addr string) (connOutcome, error) {
	_, err := askFrom(ctx, from, src, addr)
	switch {
	case err == nil:
		return outcomeAnswered, nil
	case errors.Is(err, syscall.ECONNREFUSED):
		return outcomeRefused, err
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return outcomeUnreachable, err
	case os.IsTimeout(err), errors.Is(err, context.DeadlineExceeded):
		return outcomeDropped, err
	}
	return connOutcome(fmt.Sprintf("failed otherwise (%v)", err)), err
}

// askFrom makes one TCP request from namespace ns to addr, from source
// address src ("": the one the kernel picks).
func askFrom(ctx context.Context, ns, src, addr string) (nsutil.Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, nsutil.EchoTimeout)
	defer cancel()
	var conn net.Conn
	err := nsutil.Do(ns, func() error {
		var d net.Dialer
		if src != "" {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(src), 0))
		}
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return nsutil.Reply{}, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	return nsutil.AskOn(conn, time.Until(deadline))
}

// waitOutcome polls until a request to addr has the wanted outcome twice
// in a row (the agent applies API changes asynchronously).
func waitOutcome(ctx context.Context, t *testing.T, from, addr string, want connOutcome) {
	t.Helper()
	waitOutcomeFrom(ctx, t, from, "", addr, want)
}

// waitOutcomeFrom is waitOutcome for requests from source address src.
func waitOutcomeFrom(ctx context.Context, t *testing.T, from, src, addr string, want connOutcome) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, netns.ConvergeTimeout)
	defer cancel()
	streak := 0
	seen := map[connOutcome]int{}
	var last error
	for streak < 2 {
		got, err := tryOutcome(ctx, from, src, addr)
		if ctx.Err() != nil {
			t.Fatalf("tcp %s from %s (source %q): want %s, saw %v (last error: %v)", addr, from, src, want, seen, last)
		}
		seen[got]++
		last = err
		if got == want {
			streak++
			continue
		}
		streak = 0
		time.Sleep(100 * time.Millisecond)
	}
}
