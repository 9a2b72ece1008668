package ipvs

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// agent is what `agent run --dataplane ipvs` runs on a node, in the test
// network's node namespace: the model fed with Kubernetes objects
// (portal.Tracker, as the informers feed it), the sync runner and the IPVS
// backend. The events the agent would record, the model's and the
// dataplane's, are collected.
type agent struct {
	t       *testing.T
	n       *testNet
	b       *backend
	tracker *portal.Tracker
	runner  *dataplane.Runner

	mu     sync.Mutex
	events []portal.Problem
	syncs  int // successful syncs
	log    strings.Builder
}

// Report implements portal.Reporter: the model's events.
func (a *agent) Report(_ *v1.Service, problems []portal.Problem) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, problems...)
}

// startAgent starts the agent on n's node with the Node object and the
// Services and slices given; it is stopped at the end of the test.
func (n *testNet) startAgent(objs ...any) *agent {
	n.t.Helper()
	a := &agent{t: n.t, n: n, b: n.backend(testCfg)}
	log := slog.New(slog.NewTextHandler(tlogWriter{a}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a.b.b.log = log
	var trigger func()
	a.tracker = portal.NewTracker(portal.Config{NodeName: "node"}, a, func() {
		if trigger != nil {
			trigger()
		}
	})
	a.tracker.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: nodeIP}}}})
	a.apply(objs...)
	a.runner = dataplane.NewRunner(a.b.b, a.tracker, dataplane.RunnerConfig{MinSyncPeriod: 100 * time.Millisecond, MaxBackoff: time.Second}, log, nil, nil)
	trigger = a.runner.Trigger
	a.runner.OnServiceProblem(func(p portal.Problem) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.events = append(a.events, p)
	})
	a.runner.OnApplied(func(*portal.Snapshot) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.syncs++
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- nsutil.Do(n.node, func() error { a.runner.Run(ctx); return nil })
	}()
	n.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			n.t.Errorf("agent: %v", err)
		}
	})
	return a
}

// apply hands objects to the model, as its informers would.
func (a *agent) apply(objs ...any) {
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			a.tracker.SetService(o)
		case *discovery.EndpointSlice:
			a.tracker.SetSlice(o)
		default:
			a.t.Fatalf("agent: cannot apply %T", o)
		}
	}
}

// waitSynced waits for a successful sync that started after the call.
func (a *agent) waitSynced() {
	a.t.Helper()
	a.mu.Lock()
	n := a.syncs
	a.mu.Unlock()
	a.runner.Trigger()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		done := a.syncs >= n+2 // the one running at the call may have started before it
		a.mu.Unlock()
		if done {
			return
		}
		a.runner.Trigger()
		time.Sleep(100 * time.Millisecond)
	}
	a.t.Fatalf("the agent did not sync successfully in 2 minutes (events: %v)", a.eventList())
}

func (a *agent) eventList() []portal.Problem {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]portal.Problem(nil), a.events...)
}

// tlogWriter keeps the agent's log, and sends it to the test's with -v.
type tlogWriter struct{ a *agent }

func (w tlogWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.a.t.Log(string(p))
	}
	w.a.mu.Lock()
	defer w.a.mu.Unlock()
	w.a.log.Write(p)
	return len(p), nil
}

// logged is what the agent logged so far.
func (a *agent) logged() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.String()
}

// service is a ClusterIP Service test/<name> with one TCP port 80 (target
// 8080) on clusterIP; mut changes it further.
func service(name, clusterIP string, mut func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "test", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0))},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if mut != nil {
		mut(s)
	}
	return s
}

// slice is the EndpointSlice of Service test/<name>: the test network's pods
// given, ready, on this node, port http 8080.
func slice(name string, pods ...int) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "test", Name: name + "-1", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for _, i := range pods {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{podIP(i)},
			Conditions: discovery.EndpointConditions{Ready: ptr(true)}, NodeName: ptr("node")})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// nthIP is the i-th address after base.
func nthIP(base string, i int) string {
	a := netip.MustParseAddr(base).As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(i)
	return fmt.Sprintf("%d.%d.%d.%d", v>>24, v>>16&0xff, v>>8&0xff, v&0xff)
}
