package soak

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/netns"
)

// quiet is how long an agent's sync count must hold still for it to have
// settled: longer than the conntrack cleaner's least interval between two
// walks (dataplane.ConntrackCleaner.MinInterval, 1 s), so that the walk a
// last sync started is done too.
const quiet = 3 * time.Second

// settleTimeout bounds the wait: a liveness bound, not a measure.
const settleTimeout = 5 * time.Minute

// markerName is the Service written after the churn stops.
const markerName = "soak-marker"

// serveMarker writes one Service after every other change and waits until
// the pod reaches it: the agent of from's node has then seen every change
// written before it (each kind of object arrives in the order written).
func serveMarker(ctx context.Context, c *netns.Cluster, from, to *netns.Pod) error {
	svc, err := c.CreateService(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: markerName},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80,
			TargetPort: intstr.FromInt(netns.PortHTTP)}}},
	})
	if err != nil {
		return err
	}
	if err := c.SetEndpoints(ctx, svc, netns.Ready(to)); err != nil {
		return err
	}
	_, err = netns.WaitBackends(ctx, from.Netns, "tcp", fmt.Sprintf("%s:80", svc.Spec.ClusterIP), []*netns.Pod{to}, time.Now())
	return err
}

// waitQuiet waits until the agent behind s has made at least one full sync
// since its start and its count of syncs has held still for quiet.
func waitQuiet(ctx context.Context, s *sampler) error {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	last, since := -1.0, time.Now()
	for {
		m, err := s.Metrics(ctx)
		if err == nil && m["kubeproxy_sync_full_proxy_rules_duration_seconds_count"] >= 1 {
			if n := m.Sum("onehop_syncs_total"); n != last {
				last, since = n, time.Now()
			} else if time.Since(since) >= quiet {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the agent on %s did not settle within %v (last error: %v)", s.node.Name, settleTimeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
