package cluster_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/cluster"
)

// The lease namespace deploy/base gives the cloud hook.
const leaseNS = "onehop-leases"

// TestNodeAgentOwnsOnlyItsLease: with deploy/base's RBAC and admission
// policy, a node agent (its service account, with a token bound to its pod
// on node1) may create, renew, patch and delete onehop-l2-node1, and is
// Forbidden on node2's Lease, on the controller's leader Lease, on
// kube-system's kube-controller-manager Lease and on Service status. The
// controller's identity may write Service status and its own Lease, and no
// other Lease; it may not change a Service's spec, delete a Service or an
// EndpointSlice, create a Pod, label a Node or read Secrets outside the
// lease namespace. Nor may a node agent list the lease namespace's Secrets
// or read the heartbeat key through the API.
func TestNodeAgentOwnsOnlyItsLease(t *testing.T) {
	cp, _ := cluster.StartTest(t, "rbac", "192.0.2.4")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := cp.ApplyRBAC(ctx); err != nil {
		t.Fatal(err)
	}
	admin, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node1", "node2"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Objects the agents must not touch, made by the admin.
	for _, l := range []struct{ ns, name string }{{leaseNS, "onehop-l2-node2"}, {leaseNS, "onehop-external"}, {"kube-system", "kube-controller-manager"}} {
		if _, err := admin.CoordinationV1().Leases(l.ns).Create(ctx, lease(l.ns, l.name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := admin.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	nodeID, err := cp.PodIdentity(ctx, cluster.AgentNamespace, cluster.NodeAgentServiceAccount, "onehop-node1", "node1")
	if err != nil {
		t.Fatal(err)
	}
	node, err := kubernetes.NewForConfig(nodeID.Config)
	if err != nil {
		t.Fatal(err)
	}
	leases := node.CoordinationV1().Leases(leaseNS)

	// Its own Lease: the whole life cycle.
	own, err := leases.Create(ctx, lease(leaseNS, "onehop-l2-node1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node1 creating its own Lease: %v", err)
	}
	own.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := leases.Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node1 renewing its own Lease: %v", err)
	}
	if _, err := leases.Patch(ctx, own.Name, types.MergePatchType, []byte(`{"spec":{"leaseDurationSeconds":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("node1 patching its own Lease: %v", err)
	}
	if _, err := leases.List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("node1 listing the liveness Leases: %v", err)
	}
	if err := leases.Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("node1 deleting its own Lease: %v", err)
	}

	// Every other write is refused, by RBAC or by the admission policy.
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: got %v, want Forbidden", what, err)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}
	patch := []byte(`{"spec":{"holderIdentity":"node1"}}`)
	for _, l := range []struct{ ns, name string }{{leaseNS, "onehop-l2-node2"}, {leaseNS, "onehop-external"}, {"kube-system", "kube-controller-manager"}} {
		ls := node.CoordinationV1().Leases(l.ns)
		_, err := ls.Patch(ctx, l.name, types.MergePatchType, patch, metav1.PatchOptions{})
		forbidden("node1 patching "+l.ns+"/"+l.name, err)
		cur, err := admin.CoordinationV1().Leases(l.ns).Get(ctx, l.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = ls.Update(ctx, cur, metav1.UpdateOptions{})
		forbidden("node1 updating "+l.ns+"/"+l.name, err)
		forbidden("node1 deleting "+l.ns+"/"+l.name, ls.Delete(ctx, l.name, metav1.DeleteOptions{}))
	}
	_, err = leases.Create(ctx, lease(leaseNS, "onehop-l2-node3"), metav1.CreateOptions{})
	forbidden("node1 creating node3's Lease", err)
	_, err = node.CoordinationV1().Leases("kube-system").Create(ctx, lease("kube-system", "onehop-l2-node1"), metav1.CreateOptions{})
	forbidden("node1 creating its Lease in kube-system", err)
	forbidden("node1 deleting every liveness Lease at once", leases.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	withIP := svc.DeepCopy()
	withIP.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.99"}}
	_, err = node.CoreV1().Services("default").UpdateStatus(ctx, withIP, metav1.UpdateOptions{})
	forbidden("node1 writing a Service's status", err)
	// What a node agent reads.
	if _, err := node.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node1 listing Services: %v", err)
	}
	if _, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node1 listing Pods: %v", err)
	}
	if _, err := node.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("node1 listing EndpointSlices: %v", err)
	}

	// The controller writes Service status and its leader Lease, and no
	// node's Lease.
	ctlID, err := cp.PodIdentity(ctx, cluster.AgentNamespace, cluster.ControllerServiceAccount, "onehop-controller-0", "node2")
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := kubernetes.NewForConfig(ctlID.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.CoreV1().Services("default").UpdateStatus(ctx, withIP, metav1.UpdateOptions{}); err != nil {
		t.Errorf("controller writing a Service's status: %v", err)
	}
	if _, err := ctl.CoordinationV1().Leases(leaseNS).Patch(ctx, "onehop-external", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("controller renewing its leader Lease: %v", err)
	}
	_, err = ctl.CoordinationV1().Leases(leaseNS).Patch(ctx, "onehop-l2-node2", types.MergePatchType, patch, metav1.PatchOptions{})
	forbidden("controller patching node2's Lease", err)
	_, err = ctl.CoordinationV1().Leases("kube-system").Patch(ctx, "kube-controller-manager", types.MergePatchType, patch, metav1.PatchOptions{})
	forbidden("controller patching kube-controller-manager's Lease", err)

	// Nor anything else a tenant or the cluster owns: a Service's spec,
	// a Service, a Pod, a Node, Secrets outside the lease namespace, an
	// EndpointSlice.
	spec := svc.DeepCopy()
	spec.Spec.ExternalIPs = []string{"192.0.2.98"}
	_, err = ctl.CoreV1().Services("default").Update(ctx, spec, metav1.UpdateOptions{})
	forbidden("controller changing a Service's spec", err)
	forbidden("controller deleting a Service", ctl.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}))
	_, err = ctl.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
	forbidden("controller creating a Pod", err)
	_, err = ctl.CoreV1().Nodes().Patch(ctx, "node1", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	forbidden("controller labelling a Node", err)
	for _, ns := range []string{"default", "kube-system"} {
		_, err = ctl.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		forbidden("controller listing the Secrets of "+ns, err)
		_, err = ctl.CoreV1().Secrets(ns).Get(ctx, "any", metav1.GetOptions{})
		forbidden("controller reading a Secret of "+ns, err)
	}
	forbidden("controller deleting EndpointSlices", ctl.DiscoveryV1().EndpointSlices("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	// And a node agent no Secret but the published BGP passwords (the
	// cloud hook's tests read them end to end).
	_, err = node.CoreV1().Secrets(leaseNS).List(ctx, metav1.ListOptions{})
	forbidden("node1 listing the lease namespace's Secrets", err)
	_, err = node.CoreV1().Secrets(leaseNS).Get(ctx, "onehop-l2-heartbeat", metav1.GetOptions{})
	forbidden("node1 reading the heartbeat key through the API", err)
}

func lease(ns, name string) *coordinationv1.Lease {
	holder := "admin"
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
}
