package external

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/webhook"
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

// TestIPAMAgainstAPIServer: two agents elect one allocator; requested IPs,
// pool choice, sharing, conflicts, bad annotations and exhaustion get
// answers or events; release on delete and type change; after the leader
// stops, the other rebuilds from status and never hands out a held IP.
// "split" runs the same with two `agent controller`s under deploy/base's
// RBAC, as deploy/ ships them, instead of two all-in-one agents as admin.
func TestIPAMAgainstAPIServer(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(map[bool]string{false: "all-in-one", true: "split"}[split], func(t *testing.T) { testIPAM(t, split) })
	}
}

func testIPAM(t *testing.T, split bool) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	cp, c := tp.startControlPlane("cp", "")
	cfg := ipamConfig()
	var stops map[string]func()
	if split {
		sp := newSplit(t, cp)
		cfg = sp.config(cfg)
		stops = map[string]func(){}
		for _, name := range []string{"onehop-controller-a", "onehop-controller-b"} {
			stops[name] = sp.runController(cfg, name, "")
		}
	} else {
		stops = map[string]func(){"n1": runHook(t, cfg, c, "n1"), "n2": runHook(t, cfg, c, "n2")}
	}

	createLB(t, c, "requested", 80, annotate(alloc.AnnotationLoadBalancerIPs, "192.0.2.3"))
	if ips := lbIPs(t, c, "requested", "requested IP", some); ips[0] != "192.0.2.3" {
		t.Fatalf("requested 192.0.2.3, got %v", ips)
	}
	createLB(t, c, "manual", 80, annotate(alloc.AnnotationAddressPool, "manual"))
	if ips := lbIPs(t, c, "manual", "pool choice", some); !strings.HasPrefix(ips[0], "198.51.100.") {
		t.Fatalf("pool manual: got %v", ips)
	}
	createLB(t, c, "share-a", 80, annotate(alloc.AnnotationAllowSharedIP, "k"))
	a := lbIPs(t, c, "share-a", "sharing", some)
	createLB(t, c, "share-b", 443, annotate(alloc.AnnotationAllowSharedIP, "k"))
	if b := lbIPs(t, c, "share-b", "sharing", some); b[0] != a[0] {
		t.Fatalf("share-b got %v, share-a %v: want one shared IP", b, a)
	}
	createLB(t, c, "conflict", 80, annotate(alloc.AnnotationLoadBalancerIPs, "192.0.2.3"))
	t.Logf("conflict event: %s", event(t, c, "conflict", "IPConflict"))
	createLB(t, c, "bad", 80, annotate(alloc.AnnotationLoadBalancerIPs, "192.0.2.300"))
	t.Logf("bad annotation event: %s", event(t, c, "bad", "BadAnnotation"))
	createLB(t, c, "plain", 80)
	lbIPs(t, c, "plain", "last free IP", some)
	createLB(t, c, "waiting", 80)
	t.Logf("exhaustion event: %s", event(t, c, "waiting", "AllocationFailed"))
	lbIPs(t, c, "conflict", "conflict stays without IP", none)
	checkNoDoubleAllocation(t, c)

	// Release on delete: the waiting Service gets the freed IP.
	plain := lbIPs(t, c, "plain", "before delete", some)
	if err := c.CoreV1().Services("default").Delete(context.Background(), "plain", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := lbIPs(t, c, "waiting", "release on delete", some); w[0] != plain[0] {
		t.Fatalf("waiting got %v, want the freed %v", w, plain)
	}
	// Release on type change: the status is cleared and the IP reused.
	// Another controller's status condition stays: the allocator writes
	// the ingress alone (a node agent's cache has no conditions).
	s, err := c.CoreV1().Services("default").Get(context.Background(), "requested", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Status.Conditions = []metav1.Condition{{Type: "example.com/Checked", Status: metav1.ConditionTrue, Reason: "Checked",
		LastTransitionTime: metav1.Now()}}
	if s, err = c.CoreV1().Services("default").UpdateStatus(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	if _, err := c.CoreV1().Services("default").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbIPs(t, c, "requested", "type change clears status", none)
	if s, err := c.CoreV1().Services("default").Get(context.Background(), "requested", metav1.GetOptions{}); err != nil || len(s.Status.Conditions) != 1 {
		t.Errorf("after the allocator cleared the status the conditions are %+v (%v); want the other controller's", s.Status.Conditions, err)
	}
	if ips := lbIPs(t, c, "conflict", "freed requested IP goes to the next asker", some); ips[0] != "192.0.2.3" {
		t.Fatalf("conflict got %v, want 192.0.2.3", ips)
	}
	before := checkNoDoubleAllocation(t, c)

	// Leader failover: whoever leads stops; the other must rebuild from
	// status before allocating, so the new Service gets no held IP.
	lease, err := c.CoordinationV1().Leases(cfg.LeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leader := *lease.Spec.HolderIdentity
	stops[leader]()
	if err := c.CoreV1().Services("default").Delete(context.Background(), "share-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createLB(t, c, "after-failover", 80, annotate(alloc.AnnotationAddressPool, "manual"))
	got := lbIPs(t, c, "after-failover", "allocation after failover", some)
	if l, err := c.CoordinationV1().Leases(cfg.LeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{}); err != nil || *l.Spec.HolderIdentity == leader {
		t.Fatalf("after %s stopped the lease is held by %v (%v)", leader, l.Spec.HolderIdentity, err)
	}
	if len(before[got[0]]) > 0 {
		t.Fatalf("after failover %s was given to after-failover though %v hold it", got[0], before[got[0]])
	}
	after := checkNoDoubleAllocation(t, c)
	for ip, hs := range before {
		if hs[0] != "share-a" && len(after[ip]) == 0 {
			t.Errorf("after failover %s lost its holders %v", ip, hs)
		}
	}
	t.Logf("leader before failover: %s; allocations %v", leader, after)
}

// split is a cloud hook installed as deploy/ ships it: deploy/base's RBAC
// and admission policy applied, one `agent controller` and node agents
// each with the identity the kubelet would give its pod. Any request the
// RBAC refuses fails the test: the controller's are counted at its client,
// the node agents' found in their logs.
type split struct {
	t  *testing.T
	cp *cluster.ControlPlane
	// dir holds the node agents' metrics sockets (metricsSocket).
	dir string
}

// splitLeaseNamespace is where deploy/base keeps the hook's Leases.
const splitLeaseNamespace = "onehop-leases"

func newSplit(t *testing.T, cp *cluster.ControlPlane) *split {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cp.ApplyRBAC(ctx); err != nil {
		t.Fatal(err)
	}
	return &split{t: t, cp: cp, dir: t.TempDir()}
}

// config makes cfg the split's: node agents run only their part, the Leases
// live where the RBAC allows them.
func (s *split) config(cfg config.Config) config.Config {
	cfg.SeparateController = true
	cfg.LeaseNamespace = splitLeaseNamespace
	return cfg
}

// nodeKubeconfig is the kubeconfig of node's agent pod.
func (s *split) nodeKubeconfig(node string) string {
	s.t.Helper()
	id, err := s.cp.PodIdentity(context.Background(), cluster.AgentNamespace, cluster.NodeAgentServiceAccount, "onehop-"+node, node)
	if err != nil {
		s.t.Fatal(err)
	}
	return id.Kubeconfig
}

// runController runs `agent controller`'s hook in this process as the
// controller's pod name on node, until the test ends (or the returned stop).
// A 403 answer to any of its requests fails the test.
func (s *split) runController(cfg config.Config, name, node string) (stop func()) {
	s.t.Helper()
	return runUntilEnd(s.t, "controller "+name, s.newController(cfg, name, node))
}

// newController builds `agent controller`'s hook as runController runs it.
func (s *split) newController(cfg config.Config, name, node string) *external.Hook {
	t := s.t
	t.Helper()
	id, err := s.cp.PodIdentity(context.Background(), cluster.AgentNamespace, cluster.ControllerServiceAccount, name, node)
	if err != nil {
		t.Fatal(err)
	}
	failOnForbidden(t, "controller "+name, id.Config)
	c, err := kubernetes.NewForConfig(id.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(id.Config) // the onehop.io custom resources, with crds
	if err != nil {
		t.Fatal(err)
	}
	h, err := external.NewController(cfg, c, name, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("controller", name),
		external.WithDynamicClient(dyn))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// failOnForbidden makes rc's client note every request answered 403, and
// fails t at its end if there was one (cleanups run last first: the check
// runs once what used the client stopped).
func failOnForbidden(t *testing.T, what string, rc *rest.Config) {
	var mu sync.Mutex
	var refused []string
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil && resp.StatusCode == http.StatusForbidden {
				mu.Lock()
				refused = append(refused, r.Method+" "+r.URL.String())
				mu.Unlock()
			}
			return resp, err
		})
	})
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if len(refused) > 0 {
			t.Errorf("%s was refused (403) %d requests under deploy/base's RBAC: %v", what, len(refused), refused)
		}
	})
}

// checkNodeLog fails the test when a node agent's log shows a request the
// RBAC or the admission policy refused.
func checkNodeLog(t *testing.T, node, log string) {
	t.Helper()
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(strings.ToLower(l), "forbidden") {
			t.Errorf("agent %s was refused a request under deploy/base's RBAC: %s", node, l)
		}
	}
}

// checkAllocatorHolder fails the test unless the allocator Lease of a split
// install is held by the controller named: the node agents, which run only
// their per-node part, never campaign for it.
func checkAllocatorHolder(t *testing.T, c kubernetes.Interface, controller string) {
	t.Helper()
	l, err := c.CoordinationV1().Leases(splitLeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("allocator Lease: %v", err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != controller {
		t.Fatalf("allocator Lease held by %v, want the controller %s", h, controller)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// startNodeAgent runs node n's agent (hookMain, as startAgent does) inside
// its namespace with the identity of its pod; at cleanup it is killed and
// its log searched for refused requests (checkNodeLog).
func (s *split) startNodeAgent(tp *topo, n string, cfg config.Config) *exec.Cmd {
	t := s.t
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := tp.command(n, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "OHX_HOOK="+string(b), "OHX_KUBECONFIG="+s.nodeKubeconfig(n), "OHX_NODE="+n,
		"OHX_METRICS="+s.metricsSocket(n))
	tp.startLogged(cmd, "agent "+n, func(log string) { checkNodeLog(t, n, log) })
	return cmd
}

// runAll starts a split install on cfg: the controller, and the agents
// of node1 and node2.
func (s *split) runAll(tp *topo, cfg config.Config) {
	s.t.Helper()
	s.runController(cfg, "onehop-controller-0", "")
	for _, n := range []string{"node1", "node2"} {
		s.startNodeAgent(tp, n, cfg)
	}
}

// metricsSocket is where node n's agent (startNodeAgent) serves its
// metrics: a Unix socket, which the test reaches from its own network
// namespace.
func (s *split) metricsSocket(n string) string { return filepath.Join(s.dir, "metrics-"+n+".sock") }

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

// TestL2SplitNodesOwnTheirLeases: the L2 provider as deploy/ ships it. A
// controller allocates the VIP; each node agent, with its pod's identity
// under deploy/base's RBAC and admission policy, creates and renews its own
// liveness Lease in onehop-leases, and the owner answers for the VIP. The
// owner's agent then stops cleanly: it deletes its own Lease (allowed by
// the policy) and the other node takes the VIP over at once, well before
// the Lease would have expired. Any refused request fails the test.
func TestL2SplitNodesOwnTheirLeases(t *testing.T) {
	lab := newL2Lab(t)
	cp, c := lab.twoNodeCluster("sw")
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}},
		// A long Lease: a takeover within it can only come from the
		// stopping agent deleting its own.
		L2: &l2.Config{Interfaces: []string{"eth0"}, LeaseRenewSeconds: 1, LeaseDurationSeconds: 30},
	})
	sp.runController(cfg, "onehop-controller-0", "")
	agents := map[string]*exec.Cmd{}
	for _, n := range []string{"node1", "node2"} {
		agents[n] = sp.startNodeAgent(lab, n, cfg)
	}
	createLB(t, c, "web", 80)
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})

	leases := c.CoordinationV1().Leases(splitLeaseNamespace)
	renewed := map[string]string{}
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		for _, n := range []string{"node1", "node2"} {
			l, err := leases.Get(context.Background(), "onehop-l2-"+n, metav1.GetOptions{})
			if err != nil {
				return false
			}
			if renewed[n] == "" {
				renewed[n] = l.ResourceVersion
			}
			if l.ResourceVersion == renewed[n] {
				return false // created; wait for a renewal
			}
		}
		return true
	}); !ok {
		t.Fatalf("the node agents did not create and renew their own Leases (first seen at resourceVersions %v)", renewed)
	}

	owner := l2.Owner(netip4(vip), []string{"node1", "node2"})
	other := map[string]string{"node1": "node2", "node2": "node1"}[owner]
	pod := map[string]string{"node1": "pod1", "node2": "pod2"}
	var got string
	if _, ok := waitFor(context.Background(), 20*time.Second, func() bool {
		got, _ = lab.get("client", vip+":80")
		return got == pod[owner]
	}); !ok {
		t.Fatalf("client -> %s: %q, want %s (owner %s)", vip, got, pod[owner], owner)
	}

	t0 := time.Now()
	_ = agents[owner].Process.Signal(syscall.SIGTERM)
	if _, ok := waitFor(context.Background(), 10*time.Second, func() bool {
		_, err := leases.Get(context.Background(), "onehop-l2-"+owner, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}); !ok {
		t.Fatalf("%s's agent stopped but its Lease is still there", owner)
	}
	want := lab.mac(other, "eth0")
	if _, ok := waitFor(context.Background(), 10*time.Second, func() bool { return lab.neigh(vip) == want }); !ok {
		t.Fatalf("no takeover after %s's clean stop: client's entry for %s is %q, want %s's %s", owner, vip, lab.neigh(vip), other, want)
	}
	t.Logf("clean stop of %s: Lease deleted, client moved to %s after %v (Lease duration 30 s)", owner, other, time.Since(t0).Round(time.Millisecond))
	if got, err := lab.get("client", vip+":80"); err != nil || got != pod[other] {
		t.Fatalf("after the clean stop: %q, %v; want %s", got, err, pod[other])
	}
	if _, err := leases.Get(context.Background(), "onehop-l2-"+other, metav1.GetOptions{}); err != nil {
		t.Errorf("%s's Lease: %v", other, err)
	}
}

// TestWebhookSplitController: the webhook sender as deploy/ ships it, in
// the controller under its own RBAC: it claims its term on the leader
// Lease, and its signed payloads follow a Local-policy Service's endpoint
// from n1 to n2. A refused request fails the test.
func TestWebhookSplitController(t *testing.T) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	cp, c := tp.startControlPlane("cp", "")
	rcv, url, caFile := startTLSReceiver(t)
	createReadyNode(t, c, "n1", "10.0.0.11")
	createReadyNode(t, c, "n2", "10.0.0.12")
	sp := newSplit(t, cp)
	cfg := sp.config(ipamConfig())
	cfg.Webhook = &webhook.Config{URL: url, CAFile: caFile, Secret: "s3cret", MaxBackoffSeconds: 1}
	sp.runController(cfg, "onehop-controller-0", "")

	createLB(t, c, "web", 80, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	ips := lbIPs(t, c, "web", "allocation", some)
	setEndpoints(t, c, "web", map[string]string{"n1": "10.244.1.2"})
	if p := rcv.waitNodes(t, "default/web", "n1"); !slices.Equal(p.IPs, ips) {
		t.Fatalf("payload %+v; want ips %v", p, ips)
	}
	setEndpoints(t, c, "web", map[string]string{"n2": "10.244.2.2"})
	rcv.waitNodes(t, "default/web", "n2")
	l, err := c.CoordinationV1().Leases(splitLeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil || l.Annotations[leases.AnnotationWebhookTerm] == "" {
		t.Fatalf("leader Lease %v, %v: want a webhook term recorded on it", l, err)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if rcv.bad > 0 {
		t.Errorf("the receiver rejected %d requests", rcv.bad)
	}
}
