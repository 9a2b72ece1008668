package netns

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// registerNodes creates a Node object per node namespace, the way a kubelet
// registers itself: labels (hostname, zone), pod CIDR, and a Ready status
// with the InternalIP and Hostname addresses. No node controller runs, so the
// status stays as written.
func (c *Cluster) registerNodes(ctx context.Context) error {
	for _, n := range c.Nodes {
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name: n.Name,
				Labels: map[string]string{
					"kubernetes.io/hostname":        n.Name,
					"kubernetes.io/os":              "linux",
					"topology.kubernetes.io/zone":   n.Zone,
					"topology.kubernetes.io/region": "test",
				},
			},
			Spec: v1.NodeSpec{PodCIDR: n.PodCIDR, PodCIDRs: []string{n.PodCIDR, n.PodCIDR6}},
		}
		created, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("register %s: %w", n.Name, err)
		}
		created.Status = v1.NodeStatus{
			Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: n.IP},
				{Type: v1.NodeInternalIP, Address: n.IP6},
				{Type: v1.NodeHostName, Address: n.Name},
			},
			Conditions: []v1.NodeCondition{{
				Type:               v1.NodeReady,
				Status:             v1.ConditionTrue,
				Reason:             "KubeletReady",
				LastHeartbeatTime:  metav1.Now(),
				LastTransitionTime: metav1.Now(),
			}},
		}
		if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("status of %s: %w", n.Name, err)
		}
	}
	return nil
}
