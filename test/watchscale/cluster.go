package watchscale

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/claims"
)

// simNamespace holds the simulated workload.
const simNamespace = "sim"

// podIPCIDR is where the pods' external IPs come from (externalIPCIDRs).
const podIPCIDR = "203.0.113.0/24"

// shape is the simulated cluster: nodes (one agent each), pods spread over
// them, Services with one EndpointSlice each; claims of them carry an
// external IP (onehop.io/external-ip).
type shape struct {
	nodes, podsPerNode, services, claims int
}

func nodeName(i int) string { return "node-" + strconv.Itoa(i) }

// populate creates the shape's objects.
func populate(ctx context.Context, c kubernetes.Interface, s shape) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: simNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for i := range s.nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i)}}
		n, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.1", i/250, i%250)}}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	claimed := 0
	for i := range s.nodes * s.podsPerNode {
		node := i % s.nodes
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "pod-" + strconv.Itoa(i), Namespace: simNamespace, Labels: map[string]string{"app": "sim"}},
			Spec:       corev1.PodSpec{NodeName: nodeName(node), Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/sim:1"}}},
		}
		if claimed < s.claims {
			p.Annotations = map[string]string{claims.AnnotationExternalIP: fmt.Sprintf("203.0.113.%d", 10+claimed)}
			claimed++
		}
		p, err := c.CoreV1().Pods(simNamespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = fmt.Sprintf("10.%d.%d.%d", 100+node/250, node%250, 2+i/s.nodes)
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		if _, err := c.CoreV1().Pods(simNamespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	for i := range s.services {
		name := "svc-" + strconv.Itoa(i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: simNamespace},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
		if _, err := c.CoreV1().Services(simNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return err
		}
		port, proto, ready := int32(8080), corev1.ProtocolTCP, true
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-a", Namespace: simNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: &port, Protocol: &proto}},
		}
		for j := range 2 {
			node := (i + j) % s.nodes
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 100+node/250, node%250, 2+j)},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: ptr(nodeName(node))})
		}
		if _, err := c.DiscoveryV1().EndpointSlices(simNamespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// change is one kind of object change the measurement makes, the i-th time.
type change struct {
	name string
	do   func(ctx context.Context, c kubernetes.Interface, i int) error
}

// changes are what a cluster does all day: a pod's labels, an endpoint's
// readiness, a Service's annotation, a node's status (the kubelet reports
// it every few minutes, and on every condition change).
var changes = []change{
	{"pod", func(ctx context.Context, c kubernetes.Interface, i int) error {
		p, err := c.CoreV1().Pods(simNamespace).Get(ctx, "pod-0", metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Labels["rev"] = strconv.Itoa(i)
		_, err = c.CoreV1().Pods(simNamespace).Update(ctx, p, metav1.UpdateOptions{})
		return err
	}},
	{"endpointslice", func(ctx context.Context, c kubernetes.Interface, i int) error {
		sl, err := c.DiscoveryV1().EndpointSlices(simNamespace).Get(ctx, "svc-0-a", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := i%2 == 1
		sl.Endpoints[0].Conditions.Ready = &ready
		_, err = c.DiscoveryV1().EndpointSlices(simNamespace).Update(ctx, sl, metav1.UpdateOptions{})
		return err
	}},
	{"service", func(ctx context.Context, c kubernetes.Interface, i int) error {
		svc, err := c.CoreV1().Services(simNamespace).Get(ctx, "svc-0", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations["rev"] = strconv.Itoa(i)
		_, err = c.CoreV1().Services(simNamespace).Update(ctx, svc, metav1.UpdateOptions{})
		return err
	}},
	{"node", func(ctx context.Context, c kubernetes.Interface, i int) error {
		n, err := c.CoreV1().Nodes().Get(ctx, nodeName(1), metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Duration(i) * time.Second))
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}},
}
