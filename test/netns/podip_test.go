package netns_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// A Pod annotated onehop.io/external-ip gets that IP 1:1 through the real
// agents: the annotation on the Pod object in the API is all the user
// writes. Inbound traffic from the external client reaches the pod on any
// port with the client's address; the pod's own connection to the client
// arrives from the external IP; when the pod (object) moves to the other
// node, the IP follows it. The router's route stands in for the BGP or L2
// announcement, which test/external proves separately.
func TestPodExternalIP(t *testing.T) {
	c := newPodIPCluster(t)
	ctx := ctxFor(t)
	ext := netns.ExternalIP(77)
	first, second := c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]

	// The client runs a server the pod can call.
	srv, err := nsutil.ServeEcho(c.ClientNetns, "client", []int{9090}, []int{9090}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	claim := func(p *netns.Pod) {
		t.Helper()
		zero := int64(0) // no kubelet here to finish a graceful deletion
		_ = c.Client.CoreV1().Pods("default").Delete(ctx, "singleton", metav1.DeleteOptions{GracePeriodSeconds: &zero})
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "singleton", Namespace: "default", Annotations: map[string]string{"onehop.io/external-ip": ext.String()}},
			Spec:       v1.PodSpec{NodeName: p.Node.Name, Containers: []v1.Container{{Name: "echo", Image: "echo"}}},
		}
		var created *v1.Pod
		deadline := time.Now().Add(30 * time.Second)
		for {
			created, err = c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond) // the previous object is still being deleted
		}
		if err != nil {
			t.Fatal(err)
		}
		created.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: p.IP, PodIPs: []v1.PodIP{{IP: p.IP}}}
		if _, err := c.Client.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.RouteExternal(ctx, ext.String()+"/32", p.Node); err != nil {
			t.Fatal(err)
		}
	}

	for _, p := range []*netns.Pod{first, second} {
		began := time.Now()
		claim(p)
		addr := net.JoinHostPort(ext.String(), strconv.Itoa(netns.PortHTTP))
		var r nsutil.Reply
		for {
			r, err = nsutil.Request(ctx, c.ClientNetns, "tcp", addr)
			if err == nil && r.Name == p.Name {
				break
			}
			if time.Since(began) > 30*time.Second {
				c.LogState(t)
				t.Fatalf("client -> %s: %+v, %v; want %s", addr, r, err, p.Name)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("pod %s on %s reachable on %s %v after the Pod was written", p.Name, p.Node.Name, ext, time.Since(began).Round(time.Millisecond))
		if r.SourceIP() != netns.ClientIP().String() {
			t.Errorf("inbound: the pod saw %s, want the client's %s", r.Source, netns.ClientIP())
		}
		for _, proto := range []string{"tcp", "udp"} {
			out, err := nsutil.Request(ctx, p.Netns, proto, net.JoinHostPort(netns.ClientIP().String(), "9090"))
			if err != nil {
				t.Fatalf("%s from the pod to the client: %v", proto, err)
			}
			if out.SourceIP() != ext.String() {
				t.Errorf("%s outbound: the client saw %s, want the pod's external IP %s", proto, out.Source, ext)
			}
		}
	}
	// The old node no longer translates for it.
	out, err := c.DumpRules(context.Background(), c.Nodes[0], "nft")
	if err != nil {
		t.Fatal(err)
	}
	if containsLine(out, ext.String()+" : ") {
		t.Errorf("node-1 still maps %s after the pod moved:\n%s", ext, out)
	}
}

func containsLine(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
