package external

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/test/cluster"
)

// TestPodExternalIPsSettledByController: pod external IPs in a split
// install, under deploy/base's RBAC. Each node agent watches only its own
// node's Pods and maps a Pod only when the controller granted it the
// address. team-a's Pod on node1 and team-b's younger Pod on node2 claim
// one address: the controller grants it to team-a, node2 never maps
// team-b's claim, and team-b gets an ExternalIPConflict event. node1's
// agent knows nothing of node2's Pods. With the controller down nothing
// changes but that new claims wait: team-a's Pod goes away and team-b's
// still does not get the address, a new claim is not mapped; once a
// controller is back, both are settled.
func TestPodExternalIPsSettledByController(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := cluster.Binaries(ctx); err != nil {
		t.Skipf("skipping: no control-plane binaries (%v); set %s", err, cluster.EnvBinDir)
	}
	cp, err := cluster.Start(ctx, cluster.Options{Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	createReadyNode(t, c, "node1", "10.0.0.11")
	createReadyNode(t, c, "node2", "10.0.0.12")
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{ExternalIPCIDRs: []string{"203.0.113.0/24"}, PodExternalIPs: true})
	stopCtl := sp.runController(cfg, "onehop-controller-0", "node1")
	hooks := map[string]*external.Hook{}
	for _, n := range []string{"node1", "node2"} {
		hooks[n] = sp.runNodeHook(cfg, n)
	}

	pa := claimPod(t, c, "team-a", "a", "node1", "203.0.113.50", "10.244.1.2")
	pb := claimPod(t, c, "team-b", "b", "node2", "203.0.113.50", "10.244.2.2")
	claimPod(t, c, "team-b", "c", "node2", "203.0.113.51", "10.244.2.3")
	expectMapped(t, hooks, map[string][]string{"node1": {"team-a/a=203.0.113.50"}, "node2": {"team-b/c=203.0.113.51"}})
	if msg := eventIn(t, c, pb.Namespace, pb.Name, claims.ReasonExternalIPConflict); !strings.Contains(msg, "another namespace") {
		t.Errorf("team-b/b's event %q should say a Pod of another namespace holds the address, and not name it", msg)
	}

	// The controller stops: what is settled stays, new claims wait.
	stopCtl()
	if err := c.CoreV1().Pods("team-a").Delete(ctx, pa.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	claimPod(t, c, "team-b", "d", "node2", "203.0.113.52", "10.244.2.4")
	expectMapped(t, hooks, map[string][]string{"node1": nil, "node2": {"team-b/c=203.0.113.51"}})
	time.Sleep(3 * time.Second) // a wrong mapping would have come by now
	expectMapped(t, hooks, map[string][]string{"node1": nil, "node2": {"team-b/c=203.0.113.51"}})

	// A controller again: team-b's Pod gets the address team-a let go of,
	// and the new claim is granted.
	sp.runController(cfg, "onehop-controller-1", "node1")
	expectMapped(t, hooks, map[string][]string{"node1": nil, "node2": {"team-b/b=203.0.113.50", "team-b/c=203.0.113.51", "team-b/d=203.0.113.52"}})
}

// runNodeHook runs node's hook in this process with the identity of its
// agent pod, under deploy/base's RBAC; a 403 answer fails the test.
func (s *split) runNodeHook(cfg config.Config, node string) *external.Hook {
	t := s.t
	t.Helper()
	id, err := s.cp.PodIdentity(context.Background(), cluster.AgentNamespace, cluster.NodeAgentServiceAccount, "onehop-"+node, node)
	if err != nil {
		t.Fatal(err)
	}
	failOnForbidden(t, "node agent "+node, id.Config)
	c, err := kubernetes.NewForConfig(id.Config)
	if err != nil {
		t.Fatal(err)
	}
	h, err := external.New(cfg, c, node, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", node))
	if err != nil {
		t.Fatal(err)
	}
	runUntilEnd(t, "hook "+node, h)
	return h
}

// claimPod creates a running Pod on node claiming ip.
func claimPod(t *testing.T, c kubernetes.Interface, ns, name, node, ip, podIP string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{claims.AnnotationExternalIP: ip}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/x:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP, p.Status.PodIPs = podIP, []corev1.PodIP{{IP: podIP}}
	p, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// expectMapped waits until each node's hook maps exactly the Pods named
// ("namespace/name=ip"), and fails the test if a hook ever maps a Pod of
// another node.
func expectMapped(t *testing.T, hooks map[string]*external.Hook, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		for n, h := range hooks {
			got[n] = nil
			for _, p := range h.PodExternalIPs() {
				if p.NodeName != n {
					t.Fatalf("node %s's hook maps %s of node %s: it should not even know that Pod", n, p.Pod, p.NodeName)
				}
				got[n] = append(got[n], fmt.Sprintf("%s=%s", p.Pod, p.IP))
			}
		}
		for n := range hooks {
			if !slices.Equal(got[n], want[n]) {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("pod external IPs mapped %v, want %v", got, want)
	}
}
