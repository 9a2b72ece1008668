package external

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/test/cluster"
)

// startControlPlane runs kube-apiserver + etcd in namespace n of tp at
// address and returns an admin client (dialing from inside n). address ""
// puts 10.99.0.1 on a veth pair inside n (kube-apiserver refuses to
// advertise a loopback address).
func (tp *topo) startControlPlane(n, address string) (*cluster.ControlPlane, kubernetes.Interface) {
	tp.t.Helper()
	if address == "" {
		address = "10.99.0.1"
		tp.ip(n, "link", "add", "cp0", "type", "veth", "peer", "name", "cp1")
		tp.ip(n, "addr", "add", address+"/24", "dev", "cp0")
		tp.ip(n, "link", "set", "cp0", "up")
		tp.ip(n, "link", "set", "cp1", "up")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := cluster.Binaries(ctx); err != nil {
		tp.t.Skipf("skipping: no control-plane binaries (%v); build them with hack/controlplane.sh or set %s", err, cluster.EnvBinDir)
	}
	cp, err := cluster.Start(ctx, cluster.Options{Netns: tp.name(n), Address: address, Log: slog.New(slog.NewTextHandler(tp.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		tp.t.Fatal(err)
	}
	tp.t.Cleanup(cp.Stop)
	c, err := cp.Client()
	if err != nil {
		tp.t.Fatal(err)
	}
	return cp, c
}

// twoNodeCluster puts the control plane in a namespace "cp" at 10.0.0.2
// on sw's bridge br0, and registers node1 (10.0.0.11) and node2
// (10.0.0.12) as ready Nodes: the two-node segment most hook tests use.
func (tp *topo) twoNodeCluster(sw string) (*cluster.ControlPlane, kubernetes.Interface) {
	tp.t.Helper()
	tp.add("cp")
	tp.veth(sw, "vcp", "cp", "eth0")
	tp.ip(sw, "link", "set", "vcp", "master", "br0")
	tp.ip("cp", "addr", "add", "10.0.0.2/24", "dev", "eth0")
	cp, c := tp.startControlPlane("cp", "10.0.0.2")
	createReadyNode(tp.t, c, "node1", "10.0.0.11")
	createReadyNode(tp.t, c, "node2", "10.0.0.12")
	return cp, c
}

// runHook runs node's external.Hook and model informers, wired as
// `agent run` wires them (newAgentHook), until the test ends; the returned
// stop function ends them early (a clean agent stop).
func runHook(t *testing.T, cfg config.Config, c kubernetes.Interface, node string) (stop func()) {
	t.Helper()
	h, watch, err := newAgentHook(cfg, c, node, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", node))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := startModel(ctx, c, node, watch); err != nil {
		cancel()
		t.Fatal(err)
	}
	stopHook := runUntilEnd(t, "hook "+node, h)
	stop = sync.OnceFunc(func() { stopHook(); cancel() })
	t.Cleanup(stop)
	return stop
}

// runUntilEnd runs h until the test ends; the returned stop function ends
// it early (a clean stop) and waits for it.
func runUntilEnd(t *testing.T, what string, h *external.Hook) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.Run(ctx); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

type svcOpt func(*corev1.Service)

func annotate(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func createLB(t *testing.T, c kubernetes.Interface, name string, port int32, opts ...svcOpt) {
	t.Helper()
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
	for _, o := range opts {
		o(s)
	}
	if _, err := c.CoreV1().Services("default").Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// lbIPs waits until cond holds for the Service's status IPs and returns them.
func lbIPs(t *testing.T, c kubernetes.Interface, name string, what string, cond func([]string) bool) []string {
	t.Helper()
	var ips []string
	_, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		s, err := c.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		ips = nil
		for _, in := range s.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		return cond(ips)
	})
	if !ok {
		t.Fatalf("%s: service %s has status IPs %v", what, name, ips)
	}
	return ips
}

func some(ips []string) bool { return len(ips) > 0 }
func none(ips []string) bool { return len(ips) == 0 }

// event waits for an event with reason on the named Service.
func event(t *testing.T, c kubernetes.Interface, name, reason string) string {
	t.Helper()
	return eventIn(t, c, "default", name, reason)
}

// eventIn waits for an event of reason on the object ns/name and returns
// its message.
func eventIn(t *testing.T, c kubernetes.Interface, ns, name, reason string) string {
	t.Helper()
	var msg string
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		evs, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == reason {
				msg = e.Message
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no %s event on %s/%s", reason, ns, name)
	}
	return msg
}

// eventSaying waits for an event of reason on the object ns/name whose
// message contains each of words, and returns its message.
func eventSaying(t *testing.T, c kubernetes.Interface, ns, name, reason string, words ...string) string {
	t.Helper()
	var seen []string
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		evs, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			if e.Reason != reason {
				continue
			}
			seen = append(seen, e.Message)
			if !slices.ContainsFunc(words, func(w string) bool { return !strings.Contains(e.Message, w) }) {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no %s event on %s/%s saying %q; those there: %q", reason, ns, name, words, seen)
	}
	return seen[len(seen)-1]
}

// checkNoDoubleAllocation: an IP is in the status of several Services
// only when all of them share it under one key.
func checkNoDoubleAllocation(t *testing.T, c kubernetes.Interface) map[string][]string {
	t.Helper()
	svcs, err := c.CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string][]string{}
	keys := map[string]map[string]bool{}
	for _, s := range svcs.Items {
		for _, in := range s.Status.LoadBalancer.Ingress {
			holders[in.IP] = append(holders[in.IP], s.Name)
			if keys[in.IP] == nil {
				keys[in.IP] = map[string]bool{}
			}
			keys[in.IP][s.Annotations[alloc.AnnotationAllowSharedIP]] = true
		}
	}
	for ip, hs := range holders {
		if len(hs) > 1 && (len(keys[ip]) != 1 || keys[ip][""]) {
			t.Fatalf("%s allocated to %v without a common sharing key", ip, hs)
		}
	}
	return holders
}

func ipamConfig() config.Config {
	return config.Config{
		Pools: []config.PoolConfig{
			{Name: "main", Addresses: []string{"192.0.2.1-192.0.2.3"}},
			{Name: "manual", Addresses: []string{"198.51.100.0/31"}, AutoAssign: new(false)},
		},
		LeaseNamespace: "default",
		LeaderLease: config.LeaseTiming{Duration: config.Duration{Duration: 3 * time.Second},
			RenewDeadline: config.Duration{Duration: 2 * time.Second}, RetryPeriod: config.Duration{Duration: 250 * time.Millisecond}},
	}
}

// lockedBuffer is an io.Writer a process's output may be copied into while
// the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
