package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

// podAddr reads a pod's address of the family asked for from the API server.
func podAddr(ctx context.Context, client kubernetes.Interface, pod portal.ServiceKey, v4 bool) (netip.Addr, error) {
	p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--from-pod %s: %w", pod, err)
	}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Unmap().Is4() == v4 {
			return a.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("--from-pod %s: the pod has no IPv%s address yet", pod, map[bool]string{true: "4", false: "6"}[v4])
}

// compareAPIServer says where the kernel and the API server disagree about
// the traced destination: a way in the kernel programs for a Service the
// API server does not have (or whose spec no longer has it), or a Service
// port the API server has that the kernel does not program.
func compareAPIServer(ctx context.Context, client kubernetes.Interface, t *dataplane.Trace, q dataplane.TraceQuery) ([]dataplane.TraceDisagree, error) {
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	matches := apiWaysIn(svcs.Items, q.To, q.Protocol, t.Match != nil && t.Match.Kind == "node-port")
	if t.Match == nil {
		var out []dataplane.TraceDisagree
		for _, m := range matches {
			out = append(out, dataplane.TraceDisagree{Service: m,
				Problem: fmt.Sprintf("the API server has %s/%s as a way into this Service; the kernel does not program it", q.To, q.Protocol)})
		}
		return out, nil
	}
	key, _, _ := strings.Cut(t.Match.Service, ":")
	ns, name, _ := strings.Cut(key, "/")
	if _, err := client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return []dataplane.TraceDisagree{{Service: key, Problem: "programmed in the kernel, but the API server has no such Service"}}, nil
	} else if err != nil {
		return nil, err
	}
	for _, m := range matches {
		if m == key {
			return nil, nil
		}
	}
	return []dataplane.TraceDisagree{{Service: key,
		Problem: fmt.Sprintf("the kernel sends %s/%s to this Service (%s), the Service in the API server has no such way in", q.To, q.Protocol, t.Match.Kind)}}, nil
}

// apiWaysIn returns the Services (namespace/name) with a port reached at
// to: a cluster, external or load-balancer IP, or with nodePort a node port.
func apiWaysIn(svcs []corev1.Service, to netip.AddrPort, proto string, nodePort bool) []string {
	var out []string
	for _, s := range svcs {
		var ips []string
		ips = append(ips, s.Spec.ClusterIPs...)
		ips = append(ips, s.Spec.ExternalIPs...)
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		for _, p := range s.Spec.Ports {
			if !strings.EqualFold(string(p.Protocol), proto) {
				continue
			}
			hit := nodePort && p.NodePort == int32(to.Port())
			for _, ip := range ips {
				if a, err := netip.ParseAddr(ip); err == nil && a.Unmap() == to.Addr() && p.Port == int32(to.Port()) {
					hit = true
				}
			}
			if hit {
				out = append(out, s.Namespace+"/"+s.Name)
				break
			}
		}
	}
	return out
}
