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

// update changes tw's objects from prev to next as the controllers would:
// Services gone from next are deleted with their slices; the others are
// created or updated in place, their load balancer's status rewritten, and
// their EndpointSlices created, updated or deleted by name.
func (tw *Twin) update(ctx context.Context, prev, next *Case) error {
	gone := &Case{}
	for _, s := range prev.Services {
		if next.service(s.Service.Name) == nil {
			gone.Services = append(gone.Services, s)
		}
	}
	if err := tw.remove(ctx, gone); err != nil {
		return err
	}
	svcs := tw.Client.CoreV1().Services(namespace)
	slices := tw.Client.DiscoveryV1().EndpointSlices(namespace)
	for _, s := range next.Services {
		old := prev.service(s.Service.Name)
		if old == nil {
			if err := tw.apply(ctx, &Case{Services: []*ServiceCase{s}}); err != nil {
				return err
			}
			continue
		}
		cur, err := svcs.Get(ctx, s.Service.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("%s: get Service %s: %w", tw.Name, s.Service.Name, err)
		}
		cur.Labels, cur.Spec = s.Service.Labels, *s.Service.Spec.DeepCopy()
		if cur, err = svcs.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("%s: update Service %s: %w", tw.Name, s.Service.Name, err)
		}
		cur.Status.LoadBalancer.Ingress = nil
		for _, ip := range s.Ingress {
			cur.Status.LoadBalancer.Ingress = append(cur.Status.LoadBalancer.Ingress, lbIngress(ip))
		}
		if _, err := svcs.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("%s: status of Service %s: %w", tw.Name, s.Service.Name, err)
		}
		want := map[string]bool{}
		for _, sl := range s.slices() {
			want[sl.Name] = true
			existing, err := slices.Get(ctx, sl.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				_, err = slices.Create(ctx, sl.DeepCopy(), metav1.CreateOptions{})
			case err == nil:
				upd := sl.DeepCopy()
				upd.ResourceVersion = existing.ResourceVersion
				_, err = slices.Update(ctx, upd, metav1.UpdateOptions{})
			}
			if err != nil {
				return fmt.Errorf("%s: EndpointSlice %s: %w", tw.Name, sl.Name, err)
			}
		}
		for _, sl := range old.slices() {
			if want[sl.Name] {
				continue
			}
			if err := slices.Delete(ctx, sl.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: delete EndpointSlice %s: %w", tw.Name, sl.Name, err)
			}
		}
	}
	return nil
}
