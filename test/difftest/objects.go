package difftest

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// apply writes c's objects to tw's API server as the controllers would:
// each Service, its load balancer's status, then its EndpointSlices.
func (tw *Twin) apply(ctx context.Context, c *Case) error {
	for _, s := range c.Services {
		created, err := tw.Client.CoreV1().Services(namespace).Create(ctx, s.Service.DeepCopy(), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("%s: create Service %s: %w", tw.Name, s.Service.Name, err)
		}
		if len(s.Ingress) > 0 {
			for _, ip := range s.Ingress {
				created.Status.LoadBalancer.Ingress = append(created.Status.LoadBalancer.Ingress, lbIngress(ip))
			}
			if _, err := tw.Client.CoreV1().Services(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("%s: status of Service %s: %w", tw.Name, s.Service.Name, err)
			}
		}
		for _, sl := range s.slices() {
			if _, err := tw.Client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, sl.DeepCopy(), metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("%s: create EndpointSlice %s: %w", tw.Name, sl.Name, err)
			}
		}
	}
	return nil
}

// remove deletes c's objects from tw's API server, slices first, as the
// garbage collector would after the Service.
func (tw *Twin) remove(ctx context.Context, c *Case) error {
	for _, s := range c.Services {
		for _, sl := range s.slices() {
			err := tw.Client.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, sl.Name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: delete EndpointSlice %s: %w", tw.Name, sl.Name, err)
			}
		}
		err := tw.Client.CoreV1().Services(namespace).Delete(ctx, s.Service.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: delete Service %s: %w", tw.Name, s.Service.Name, err)
		}
	}
	return nil
}

func lbIngress(ip string) v1.LoadBalancerIngress {
	return v1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(v1.LoadBalancerIPModeVIP)}
}
