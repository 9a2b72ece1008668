package difftest

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/nsutil"
)

// barrierNamespace keeps the barrier apart from the case's objects.
const barrierNamespace = metav1.NamespaceSystem

// barrierTimeout bounds how long a twin's proxies may take to serve a new
// Service: a liveness bound, not a performance one. In the test VM
// (ONEHOP_VM), whose CPU is emulated, kube-proxy's IPVS mode takes over a
// minute for a sync: it runs ipset once per set and entry.
func barrierTimeout() time.Duration {
	if os.Getenv("ONEHOP_VM") != "" {
		return 5 * time.Minute
	}
	return 60 * time.Second
}

// barrierState is the twin's current barrier Service.
type barrierState struct {
	round int
	name  string
}

// barrierPod answers every barrier.
var barrierPod = podRef{1, 1}

// sync writes a fresh dual-stack barrier Service (and its EndpointSlices)
// after removing the last one, and returns once every node reaches it on
// both cluster IPs. Each
// proxy reads Services and EndpointSlices in the order the API server
// wrote them, so a node serving the barrier has seen every earlier write.
func (tw *Twin) sync(ctx context.Context) error {
	tw.barrier.round++
	if tw.barrier.name != "" {
		if err := tw.deleteBarrier(ctx, tw.barrier.name); err != nil {
			return err
		}
	}
	round := tw.barrier.round
	name := fmt.Sprintf("barrier-%d", round)
	tw.barrier.name = name
	// Dual-stack: each family's proxier (kube-proxy runs one per family)
	// must have seen everything.
	ips := barrierIPs(round)
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: barrierNamespace},
		Spec: v1.ServiceSpec{ClusterIP: ips[0].String(), IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
			Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	var addrs []string
	for _, ip := range ips {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, ip.String())
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, family(ip))
		addrs = append(addrs, net.JoinHostPort(ip.String(), strconv.Itoa(80)))
	}
	if _, err := tw.Client.CoreV1().Services(barrierNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("%s: barrier Service: %w", tw.Name, err)
	}
	for _, f := range svc.Spec.IPFamilies {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: sliceName(name, f, 0), Namespace: barrierNamespace, Labels: map[string]string{
				discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: managedBy}},
			AddressType: discoveryv1.AddressType(f),
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(int32(8080))}},
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{barrierPod.IPOf(f).String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(nodeName(barrierPod.Node)),
			}},
		}
		if _, err := tw.Client.DiscoveryV1().EndpointSlices(barrierNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("%s: barrier EndpointSlice: %w", tw.Name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, barrierTimeout())
	defer cancel()
	for _, n := range tw.Nodes {
		for _, addr := range addrs {
			if err := tw.awaitBarrier(ctx, n, name, addr); err != nil {
				return err
			}
		}
	}
	return nil
}

// awaitBarrier returns once node n reaches the barrier pod at addr.
func (tw *Twin) awaitBarrier(ctx context.Context, n *Node, name, addr string) error {
	// Each request waits a little longer than the one before, up to a
	// second. A short first wait matters for IPv6: before the proxy
	// serves the barrier, a rejected SYN is seen only at its
	// retransmission, a second later (probe.go), while a fresh SYN sent
	// once it serves it is answered at once.
	var last string
	wait := 100 * time.Millisecond
	for {
		rctx, rcancel := context.WithTimeout(ctx, wait)
		wait = min(2*wait, time.Second)
		rep, err := nsutil.Request(rctx, n.Netns, "tcp", addr)
		rcancel()
		if err == nil && rep.Name == barrierPod.Name() {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = "answered by " + rep.Name
		}
		if msg := tw.exited(); msg != "" {
			return fmt.Errorf("%s", msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s does not serve barrier %s (%s) within %v: %s", tw.Name, n.Name, name, addr, barrierTimeout(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (tw *Twin) deleteBarrier(ctx context.Context, name string) error {
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		err := tw.Client.DiscoveryV1().EndpointSlices(barrierNamespace).Delete(ctx, sliceName(name, f, 0), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: delete barrier %s: %w", tw.Name, name, err)
		}
	}
	err := tw.Client.CoreV1().Services(barrierNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: delete barrier %s: %w", tw.Name, name, err)
	}
	return nil
}
