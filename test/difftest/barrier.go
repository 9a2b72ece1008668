package difftest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
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
// Service: a liveness bound, not a performance one.
const barrierTimeout = 60 * time.Second

// barrierState is the twin's current barrier Service.
type barrierState struct {
	round int
	name  string
}

// barrierPod answers every barrier.
var barrierPod = podRef{1, 1}

// sync writes a fresh barrier Service (and its EndpointSlice) after
// removing the last one, and returns once every node reaches it. Each
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
	a := barrierBase.As4()
	a[3] = byte(10 + round%200)
	ip := netip.AddrFrom4(a).String()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: barrierNamespace},
		Spec: v1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := tw.Client.CoreV1().Services(barrierNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("%s: barrier Service: %w", tw.Name, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: barrierNamespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: managedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{barrierPod.IP().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(nodeName(barrierPod.Node)),
		}},
	}
	if _, err := tw.Client.DiscoveryV1().EndpointSlices(barrierNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("%s: barrier EndpointSlice: %w", tw.Name, err)
	}
	addr := net.JoinHostPort(ip, strconv.Itoa(80))
	ctx, cancel := context.WithTimeout(ctx, barrierTimeout)
	defer cancel()
	for _, n := range tw.Nodes {
		var last string
		for {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			rep, err := nsutil.Request(rctx, n.Netns, "tcp", addr)
			rcancel()
			if err == nil && rep.Name == barrierPod.Name() {
				break
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
				return fmt.Errorf("%s: %s does not serve barrier %s (%s) within %v: %s", tw.Name, n.Name, name, addr, barrierTimeout, last)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

func (tw *Twin) deleteBarrier(ctx context.Context, name string) error {
	err := tw.Client.DiscoveryV1().EndpointSlices(barrierNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		err = tw.Client.CoreV1().Services(barrierNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: delete barrier %s: %w", tw.Name, name, err)
	}
	return nil
}
