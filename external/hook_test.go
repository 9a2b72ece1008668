package external

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/internal/hooktest"
	"github.com/onehop/onehop/external/l2"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/providers"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

// flaky fails its first fails updates.
type flaky struct {
	mu    sync.Mutex
	fails int
	calls int
}

func (p *flaky) Name() string { return "flaky" }

func (p *flaky) Update(context.Context, *providers.State) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls <= p.fails {
		return errors.New("router unreachable")
	}
	return nil
}

func (p *flaky) Close(context.Context) error { return nil }

func (p *flaky) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// A provider whose update fails is told the same state again after a
// back-off, although nothing changed, until it takes it; then it is left
// alone, and a provider that took the state is not told it again.
func TestFailedProviderUpdateIsRetried(t *testing.T) {
	h, err := New(config.Config{LeaseNamespace: "default"}, fake.NewClientset(), "node1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	bad, good := &flaky{fails: 2}, &flaky{}
	h.AddProvider(bad)
	h.AddProvider(good)
	runHook(t, h)
	deadline := time.Now().Add(15 * time.Second)
	for bad.count() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the failing provider was told %d times, want a third (successful) try without any change", bad.count())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2500 * time.Millisecond) // longer than the next back-off
	if n := bad.count(); n != 3 {
		t.Errorf("the provider was told %d times; after its success it should be left alone (3)", n)
	}
	if n := good.count(); n != 1 {
		t.Errorf("the provider that took the state was told %d times, want 1", n)
	}
}

// runHook runs h until the test ends, and fails the test if Run returns
// an error; the context returned ends with it.
func runHook(t *testing.T, h *Hook) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ctx
}

// TestHookSharesTheModelsWatch: with WithServiceWatch the agent watches
// Services and EndpointSlices once for its model and its hook, and the
// hook still sees what the model leaves out: a Service of another proxy
// holds its cluster IP, so another Service's spec.externalIPs entry for
// that address is refused.
func TestHookSharesTheModelsWatch(t *testing.T) {
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other",
		Labels: map[string]string{portal.LabelServiceProxyName: "someone-else"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.50", ClusterIPs: []string{"10.96.0.50"},
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			ExternalIPs: []string{"10.96.0.50"}, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	client := fake.NewClientset(other, web)
	w := portal.NewServiceWatch(client, 0)
	h, err := New(config.Config{LeaseNamespace: "default", ExternalIPCIDRs: []string{"10.96.0.0/16"}}, client, "node1",
		slog.New(slog.NewTextHandler(io.Discard, nil)), WithServiceWatch(w))
	if err != nil {
		t.Fatal(err)
	}
	ctx := runHook(t, h)
	tr := portal.NewTracker(portal.Config{NodeName: "node1"}, nil, nil)
	synced, err := (&portal.Informers{Client: client, NodeName: "node1", Watch: w}).Start(ctx, tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := portal.WaitForSync(ctx, synced); err != nil {
		t.Fatal(err)
	}
	if tr.Service(alloc.KeyOf(web)) == nil || tr.Service(alloc.KeyOf(other)) != nil {
		t.Errorf("the model holds web: %v, other's Service: %v; want web alone", tr.Service(alloc.KeyOf(web)) != nil, tr.Service(alloc.KeyOf(other)) != nil)
	}
	var refused map[portal.ServiceKey][]netip.Addr
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ok bool
		if refused, ok = h.RefusedExternalIPs(); ok || time.Now().After(deadline) {
			break
		}
	}
	if got := refused[alloc.KeyOf(web)]; len(got) != 1 || got[0] != netip.MustParseAddr("10.96.0.50") {
		t.Errorf("refused %v; want web's 10.96.0.50, the cluster IP of another proxy's Service", refused)
	}
	watches := map[string]int{}
	for _, a := range client.Actions() {
		if a.GetVerb() == "watch" {
			watches[a.GetResource().Resource]++
		}
	}
	if watches["services"] != 1 || watches["endpointslices"] != 1 {
		t.Errorf("watches %v; want one of services and one of endpointslices for model and hook", watches)
	}
}

// A webhook whose secret file is missing does not stop the hook: it is
// reported (event on the Node, metric, /healthz detail) and started once
// the file appears, and its recovery is reported.
func TestProviderStartRetried(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	c := fake.NewClientset()
	reg := prometheus.NewRegistry()
	hs := dataplane.NewHealthServer("127.0.0.1:0", time.Second, nil)
	cfg := config.Config{LeaseNamespace: "default", Webhook: &webhook.Config{URL: "https://127.0.0.1:1/hook", SecretFile: secret}}
	h, err := New(cfg, c, "node1", slog.New(slog.NewTextHandler(io.Discard, nil)), WithProviderHealth(hs, dataplane.NewMetrics(reg)))
	if err != nil {
		t.Fatal(err)
	}
	runHook(t, h)
	waitFor(t, "a ProviderFailed event on node1", func() bool { return nodeEvent(t, c, "ProviderFailed") != "" })
	if msg := nodeEvent(t, c, "ProviderFailed"); !strings.Contains(msg, "webhook") || !strings.Contains(msg, secret) {
		t.Fatalf("ProviderFailed %q: want the provider and the missing file named", msg)
	}
	if d := hooktest.ProviderDetail(t, hs); !strings.HasPrefix(d["webhook"], "start: ") {
		t.Fatalf("/healthz providerFailures %v, want webhook's start error", d)
	}
	if v, _ := hooktest.Gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "webhook"}); v != 0 {
		t.Fatalf("onehop_provider_up{webhook} = %v while failing, want 0", v)
	}
	waitFor(t, "a second start attempt", func() bool {
		v, _ := hooktest.Gauge(t, reg, "onehop_provider_failures_total", map[string]string{"provider": "webhook", "stage": "start"})
		return v >= 2
	})
	if n := countNodeEvents(t, c, "ProviderFailed"); n != 1 {
		t.Fatalf("%d ProviderFailed events after retries of one failure, want 1", n)
	}

	if err := os.WriteFile(secret, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ProviderRecovered event on node1", func() bool { return nodeEvent(t, c, "ProviderRecovered") != "" })
	if v, _ := hooktest.Gauge(t, reg, "onehop_provider_up", map[string]string{"provider": "webhook"}); v != 1 {
		t.Fatalf("onehop_provider_up{webhook} = %v after the start, want 1", v)
	}
	if d := hooktest.ProviderDetail(t, hs); len(d) != 0 {
		t.Fatalf("/healthz providerFailures after recovery: %v, want none", d)
	}
}

// nodeEvent returns the message of an event of reason on Node node1, or "".
func nodeEvent(t *testing.T, c *fake.Clientset, reason string) string {
	t.Helper()
	evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == "node1" && e.Reason == reason {
			return e.Message
		}
	}
	return ""
}

// countNodeEvents counts the occurrences of events of reason on node1
// (an event repeated by the recorder counts its Count).
func countNodeEvents(t *testing.T, c *fake.Clientset, reason string) int {
	t.Helper()
	evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == "node1" && e.Reason == reason {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPoolAddresses: a pool's total is its used and free addresses, capped
// at the largest int64 (an IPv6 /64 has more).
func TestPoolAddresses(t *testing.T) {
	got := poolAddresses(map[string][2]int64{"main": {1, 2}, "v6": {3, math.MaxInt64}, "empty": {0, 0}})
	want := map[string]dataplane.PoolAddresses{"main": {InUse: 1, Total: 3}, "v6": {InUse: 3, Total: math.MaxInt64}, "empty": {}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("poolAddresses = %v, want %v", got, want)
	}
}

// TestHeartbeatMetrics: no series while heartbeats are off; with them, the
// peers by state and every refusal reason, from the heartbeats' own
// counts; a hook built again on the same registry keeps the first.

// BenchmarkNodeState10k is what a node agent's hook computes each time it
// looks (state): 10k Services with 10 endpoints each, 100 of them
// LoadBalancers. Before the hook became event-driven it looked 4 times a
// second whatever happened; now it looks on a change, or when a node's
// Lease could expire.
func BenchmarkNodeState10k(b *testing.B) {
	h, err := New(config.Config{Pools: []config.PoolConfig{{Name: "p", Addresses: []string{"203.0.113.0/24"}}}, SeparateController: true,
		L2: &l2.Config{Interfaces: []string{"eth0"}}}, fake.NewClientset(), "node1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		name := fmt.Sprintf("s-%05d", i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("u" + name)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
		if i%100 == 0 {
			svc.Spec.Type = corev1.ServiceTypeLoadBalancer
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("203.0.113.%d", i/100+1)}}
		}
		_ = h.services.GetStore().Add(svc)
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
		for j := range 10 {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.%d", i/256%256, i%256, j+1)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(fmt.Sprintf("node%d", j%3+1))})
		}
		_ = h.slices.GetStore().Add(es)
	}
	for n := range 3 {
		_ = h.nodes.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node%d", n+1)}})
	}
	b.ResetTimer()
	for b.Loop() {
		providers.Fingerprint(h.state())
	}
}

// BenchmarkL2Takeover is what one node's hook computes when another node's
// liveness Lease goes (its agent stopped): the new owner of every L2 IP,
// and what this node's responder answers for, as Run looks at a change of
// liveness. 10,000 LoadBalancer Services of one IP each (Cluster policy,
// one ready endpoint), on 3, 500 and 5,000 nodes, every node's agent
// alive until the op. The informer stores and the liveness tracker are
// filled directly; no apiserver runs. Each op takes one node's Lease
// away; bringing it back, and the look after, are not timed.
func BenchmarkL2Takeover(b *testing.B) {
	bySize(b, func(tb *takeoverBench, nodes, i int) {
		// Every node but this one (node 0) dies in turn.
		victim := benchNode(1 + i%(nodes-1))
		tb.hook.liveness.Forget(leases.LeasePrefix + victim)
		tb.hook.followLiveness()
		tb.b.StopTimer()
		tb.check(victim)
		tb.renew(victim)
		tb.hook.followLiveness()
		tb.b.StartTimer()
	})
}

// BenchmarkL2Look is a whole look (state, fingerprint, providers told)
// after a change that is not of liveness alone: a Service's endpoint
// moved, so the L2 owners are compared with the new state, and none
// moves.
func BenchmarkL2Look(b *testing.B) {
	bySize(b, func(tb *takeoverBench, nodes, i int) {
		tb.moveEndpoint(i%10000, 1+i%(nodes-1))
		tb.look(tb.b.Context())
	})
}

// bySize runs op, the i-th time with i, at 10,000 IPs on 3, 500 and 5,000
// nodes, after a first look.
func bySize(b *testing.B, op func(tb *takeoverBench, nodes, i int)) {
	for _, nodes := range []int{3, 500, 5000} {
		b.Run(fmt.Sprintf("ips=10000/nodes=%d", nodes), func(b *testing.B) {
			tb := newTakeoverBench(b, 10000, nodes)
			tb.look(b.Context())
			for i := 0; b.Loop(); i++ {
				op(tb, nodes, i)
			}
		})
	}
}

// takeoverBench is a node agent's hook with an L2 provider whose
// responder records what it is told.
type takeoverBench struct {
	b        *testing.B
	hook     *Hook
	l2       *providers.L2
	answered *answered
	// last is the state the L2 provider was last told.
	last *providers.State
	told map[providers.Provider]string
	rv   int
}

func benchNode(i int) string { return fmt.Sprintf("node-%04d", i) }

func newTakeoverBench(b *testing.B, ips, nodes int) *takeoverBench {
	b.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := New(config.Config{Pools: []config.PoolConfig{{Name: "p", Addresses: []string{"2001:db8::/112"}}}, SeparateController: true,
		L2: &l2.Config{Interfaces: []string{"eth0"}}}, fake.NewClientset(), benchNode(0), log)
	if err != nil {
		b.Fatal(err)
	}
	pool := netip.MustParseAddr("2001:db8::1")
	prog := map[providers.Served]providers.Programmed{}
	ip := pool
	for i := range ips {
		name := fmt.Sprintf("s-%05d", i)
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("u" + name)},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip.String()}}
		_ = h.services.GetStore().Add(svc)
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.%d.%d.1", i/256%256, i%256)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To(benchNode(i % nodes))}}}
		_ = h.slices.GetStore().Add(es)
		prog[providers.Served{IP: ip, Service: alloc.KeyOf(svc)}] = providers.Programmed{AnyEndpoint: true}
		ip = ip.Next()
	}
	h.programmed = prog
	for n := range nodes {
		_ = h.nodes.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode(n)},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", 100+n/65536, n/256%256, n%256)}}}})
	}
	h.liveness = leases.NewLiveness(fake.NewClientset(), "default", benchNode(0), time.Second, 3*time.Second, log, h.poke)
	tb := &takeoverBench{b: b, hook: h, told: map[providers.Provider]string{}}
	for n := range nodes {
		tb.renew(benchNode(n))
	}
	h.liveness.RenewedOwn()
	tb.answered = &answered{}
	tb.l2 = providers.NewL2(tb.answered, providers.L2Options{Liveness: h.liveness, Log: log})
	h.providers = []providers.Provider{tb.l2}
	return tb
}

// renew is node's liveness Lease renewed, as the Lease informer reports it.
func (tb *takeoverBench) renew(node string) {
	tb.rv++
	now := metav1.NewMicroTime(time.Now())
	tb.hook.liveness.Observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leases.LeasePrefix + node, ResourceVersion: fmt.Sprint(tb.rv)},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, RenewTime: &now}})
}

// look is what Run does after a change: the state, its fingerprint, and
// the providers told when it changed.
func (tb *takeoverBench) look(ctx context.Context) {
	st := tb.hook.state()
	fp := providers.Fingerprint(st)
	for _, p := range tb.hook.providers {
		if tb.told[p] == fp {
			continue
		}
		if err := p.Update(ctx, st); err != nil {
			tb.b.Fatal(err)
		}
		tb.told[p] = fp
		tb.last = st
	}
}

// check fails the benchmark unless the owners are l2.Owner's over the
// nodes alive, victim dead, and this node answers for its own.
func (tb *takeoverBench) check(victim string) {
	st := tb.last
	if st.Alive(victim) {
		tb.b.Fatalf("%s alive after its Lease went", victim)
	}
	for _, ip := range []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::1000")} {
		if want, _ := providers.L2Owner(st, ip); tb.l2.Owner(ip) != want {
			tb.b.Fatalf("%s: owner %q, want %q", ip, tb.l2.Owner(ip), want)
		}
	}
	if len(tb.answered.owned) != len(tb.l2.OwnedBy(st.Node)) {
		tb.b.Fatalf("answering for %d IPs, owning %d", len(tb.answered.owned), len(tb.l2.OwnedBy(st.Node)))
	}
}

// moveEndpoint moves Service i's endpoint to node n.
func (tb *takeoverBench) moveEndpoint(i, n int) {
	name := fmt.Sprintf("s-%05d", i)
	obj, _, _ := tb.hook.slices.GetStore().GetByKey("default/" + name + "-x")
	es := obj.(*discoveryv1.EndpointSlice).DeepCopy()
	es.Endpoints[0].NodeName = ptr.To(benchNode(n))
	_ = tb.hook.slices.GetStore().Update(es)
}

// answered records what the L2 provider tells its responder.
type answered struct{ owned []netip.Addr }

func (a *answered) Set(ips []netip.Addr)    { a.owned = ips }
func (a *answered) Reannounce([]netip.Addr) {}
func (a *answered) Owned() []netip.Addr     { return a.owned }
func (a *answered) Close()                  {}
