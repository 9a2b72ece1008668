package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
)

// writer applies one model's changes through the API server, as the
// Service's owner and the EndpointSlice controller would, and keeps the
// Services as last written.
type writer struct {
	c     *netns.Cluster
	model *Model
	pods  []*netns.Pod

	mu   sync.Mutex
	svcs map[int]*v1.Service // by slot
}

func newWriter(c *netns.Cluster, m *Model) *writer {
	return &writer{c: c, model: m, pods: c.Pods(), svcs: map[int]*v1.Service{}}
}

// step makes the model's next change in the API.
func (w *writer) step(ctx context.Context) (Change, error) {
	ch := w.model.Next()
	return ch, w.apply(ctx, ch)
}

func (w *writer) apply(ctx context.Context, ch Change) error {
	w.mu.Lock()
	cur := w.svcs[ch.Slot]
	w.mu.Unlock()
	var err error
	switch ch.Kind {
	case Create:
		cur, err = w.create(ctx, ch)
	case Delete:
		err = untilDone(ctx, func() error { return w.c.DeleteService(ctx, metav1.NamespaceDefault, ch.Name) })
		cur = nil
	case Ports, Traffic, Affinity:
		cur, err = w.update(ctx, cur, ch.Spec)
	}
	if err == nil && (ch.Kind == Create || ch.Kind == Ports || ch.Kind == Scale || ch.Kind == Replace) {
		err = untilDone(ctx, func() error { return w.c.SetEndpoints(ctx, cur, w.endpoints(ch.Spec)) })
	}
	if err != nil {
		return fmt.Errorf("%v %s: %w", ch.Kind, ch.Name, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cur == nil {
		delete(w.svcs, ch.Slot)
	} else {
		w.svcs[ch.Slot] = cur
	}
	return nil
}

func (w *writer) create(ctx context.Context, ch Change) (*v1.Service, error) {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: ch.Name, Namespace: metav1.NamespaceDefault}}
	policy := v1.IPFamilyPolicySingleStack
	if ch.Spec.DualStack {
		policy = v1.IPFamilyPolicyPreferDualStack
	}
	svc.Spec.IPFamilyPolicy = &policy
	svc.Spec.Type = v1.ServiceTypeClusterIP
	if ch.Spec.NodePort {
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	setSpec(svc, ch.Spec)
	var out *v1.Service
	err := untilDone(ctx, func() error {
		var err error
		out, err = w.c.CreateService(ctx, svc.DeepCopy())
		if apierrors.IsAlreadyExists(err) { // an earlier try that timed out made it
			out, err = w.c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		}
		return err
	})
	return out, err
}

// update writes s onto cur; on a conflict (an earlier try that timed out
// went through) onto the Service as it is now.
func (w *writer) update(ctx context.Context, cur *v1.Service, s Spec) (*v1.Service, error) {
	services := w.c.Client.CoreV1().Services(cur.Namespace)
	var out *v1.Service
	err := untilDone(ctx, func() error {
		next := cur.DeepCopy()
		setSpec(next, s)
		var err error
		out, err = services.Update(ctx, next, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if fresh, gerr := services.Get(ctx, cur.Name, metav1.GetOptions{}); gerr == nil {
				cur = fresh
			}
		}
		return err
	})
	return out, err
}

// setSpec writes the model's ports, traffic policy and affinity into svc,
// keeping what the API server allocated (cluster IPs, node ports).
func setSpec(svc *v1.Service, s Spec) {
	old := svc.Spec.Ports
	svc.Spec.Ports = nil
	for i, p := range s.Ports {
		sp := v1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: intstr.FromInt32(p.Target)}
		if i < len(old) {
			sp.NodePort = old[i].NodePort
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	svc.Spec.ExternalTrafficPolicy = ""
	if s.NodePort {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		if s.Local {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}
	}
	svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig = v1.ServiceAffinityNone, nil
	if s.Affinity {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(600))}}
	}
}

func (w *writer) endpoints(s Spec) []netns.Endpoint {
	pods := make([]*netns.Pod, len(s.Endpoints))
	for i, p := range s.Endpoints {
		pods[i] = w.pods[p]
	}
	return netns.Ready(pods...)
}

// udpTarget returns a UDP address of a random Service of the writer's, a
// cluster IP or nodeIP's node port, or "" when it has no UDP port.
func (w *writer) udpTarget(r *rand.Rand, nodeIP string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, svc := range w.svcs {
		for _, p := range svc.Spec.Ports {
			if p.Protocol != v1.ProtocolUDP {
				continue
			}
			out = append(out, net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(p.Port))))
			if p.NodePort != 0 {
				out = append(out, net.JoinHostPort(nodeIP, strconv.Itoa(int(p.NodePort))))
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return out[r.IntN(len(out))]
}

// untilDone runs write until it succeeds or fails for a reason other than
// a busy API server (timeouts, 429, 5xx), which on a loaded machine must
// slow the run down, not fail it: up to a minute, backing off.
func untilDone(ctx context.Context, write func() error) error {
	deadline := time.Now().Add(time.Minute)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := write()
		if err == nil || !busy(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

func busy(err error) bool {
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) ||
		errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err)
}
