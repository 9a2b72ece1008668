package scale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// knobs are the run's size, from the environment.
type knobs struct {
	services, endpoints, flips int
	report                     string
	profiles                   string // a directory for node 1's agent's pprof profiles
	// preload writes the objects while no agent runs, then starts them:
	// the run measures nodes that join a big cluster (start until served,
	// memory, flips, restarts) instead of the agents' CPU in the storm of
	// writes, which on a small machine slows the apiserver down too much
	// to write 50k Services in reasonable time (ONEHOP_SCALE_PRELOAD=1).
	preload bool
}

func knobsFromEnv(t *testing.T) knobs {
	k := knobs{services: 300, endpoints: 10, flips: 10, report: os.Getenv("ONEHOP_SCALE_REPORT"),
		profiles: os.Getenv("ONEHOP_SCALE_PROFILES"), preload: os.Getenv("ONEHOP_SCALE_PRELOAD") != ""}
	for name, v := range map[string]*int{"ONEHOP_SCALE_SERVICES": &k.services, "ONEHOP_SCALE_ENDPOINTS": &k.endpoints, "ONEHOP_SCALE_FLIPS": &k.flips} {
		if s := os.Getenv(name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", name, s)
			}
			*v = n
		}
	}
	return k
}

// flipGap is the pause between the requests that watch a flip: the
// latency is measured to within it.
const flipGap = 2 * time.Millisecond

// settle is how long the run waits after the objects are written before
// it reads memory: longer than the agent's idle time before it returns a
// burst's free heap (dataplane.MemoryReleaser).
const settle = 10 * time.Second

// TestEndToEndScale: see the package comment.
func TestEndToEndScale(t *testing.T) {
	k := knobsFromEnv(t)
	res := &results{knobs: k, load: [2]string{loadAvg()}}
	cfg := netns.Config{Nodes: 2, PodsPerNode: 2}
	if k.profiles != "" {
		cfg.AgentArgs = append(cfg.AgentArgs, "--profiling")
	}
	c := netns.NewForTest(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	node := c.Nodes[0]
	from := node.Pods[0]
	podA, podB := c.Nodes[1].Pods[0], c.Nodes[1].Pods[1]
	prof := newProfiler(t, k.profiles, node)

	// A client of its own: the objects are written as fast as the
	// apiserver takes them.
	rc := c.CP.RESTConfig()
	rc.QPS, rc.Burst = 5000, 10000
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}

	// kube-proxy beside node 2's agent, when asked for (EnvKubeProxy).
	var kp *kubeProxy
	var kpCPU0 float64
	if !k.preload {
		kp = startKubeProxy(t, c, c.Nodes[1])
		if kp != nil {
			kpCPU0 = cpuSeconds(t, kp.proc.Pid())
		}
	} else {
		// No agent while the objects are written; node 1 starts cold.
		for _, n := range c.Nodes {
			c.KillAgent(n)
			<-n.Agent().Done()
		}
		if out, err := nsutil.Exec(ctx, node.Netns, c.AgentArgs(node)[0], "cleanup"); err != nil {
			t.Fatalf("agent cleanup: %v: %s", err, out)
		}
	}

	// Creation: N Services with E endpoints each, then the probe Service.
	var cpu0 float64
	if !k.preload {
		cpu0 = cpuSeconds(t, node.Agent().Pid())
	}
	began := time.Now()
	stopProf := func() {}
	if !k.preload {
		stopProf = prof.cpu(ctx, "create", 20)
	}
	createServices(ctx, t, client, k)
	probe, err := c.CreateService(ctx, probeService())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetEndpoints(ctx, probe, netns.Ready(podA)); err != nil {
		t.Fatal(err)
	}
	res.create = time.Since(began)
	written := time.Now()
	if k.preload {
		// The nodes join: node 2 first (it serves the pods), then node 1,
		// timed from its start until the probe Service answers.
		if err := c.StartAgent(ctx, c.Nodes[1]); err != nil {
			t.Fatal(err)
		}
		stopProf = prof.cpu(ctx, "start", 10)
		written = time.Now()
		if err := c.StartAgent(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	addr := net.JoinHostPort(probe.Spec.ClusterIP, "80")
	if _, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, []*netns.Pod{podA}, written); err != nil {
		t.Fatalf("the probe Service, created last: %v", err)
	}
	res.converge = time.Since(written)
	res.createCPU = cpuSeconds(t, node.Agent().Pid()) - cpu0
	stopProf()
	t.Logf("created %d Services x %d endpoints in %v; the last one answered %v after the last write (preload: after node 1's agent started); agent CPU %.1f s",
		k.services, k.endpoints, res.create.Round(time.Millisecond), res.converge.Round(time.Millisecond), res.createCPU)
	if k.preload {
		kp = startKubeProxy(t, c, c.Nodes[1])
		if kp != nil {
			written = kp.start
		}
	}
	// Memory once settled: nothing changes for a while, as on a node
	// between changes (the agent gives a burst's free heap back when idle).
	time.Sleep(settle)
	prof.heap(ctx, "synced")
	res.mem = memory(t, node.Agent().Pid())
	res.metrics = agentMetrics(ctx, t, node)
	if kp != nil {
		res.kubeProxy = kp.measure(ctx, t, kpCPU0, probe.Spec.ClusterIP, written)
		t.Logf("kube-proxy: caught up %v after the last write (%v), CPU %.1f s, VmRSS %s",
			res.kubeProxy.converge.Round(time.Millisecond), res.kubeProxy.caughtUp, res.kubeProxy.createCPU, mib(res.kubeProxy.mem["VmRSS"]))
	}

	// A request loop from a pod for the rest of the run: every request is
	// a new connection to the probe Service, and none may fail.
	loop := startLoop(ctx, from.Netns, addr)
	defer loop.stop()

	// Endpoint flips: the Service moves between two pods that both keep
	// running, so a request may reach either until the agent follows,
	// and must never fail.
	cur := podA
	stopProf = prof.cpu(ctx, "flips", 3)
	for i := range k.flips {
		next := map[*netns.Pod]*netns.Pod{podA: podB, podB: podA}[cur]
		since := time.Now()
		if err := c.SetEndpoints(ctx, probe, netns.Ready(next)); err != nil {
			t.Fatal(err)
		}
		d, err := netns.WaitBackendsEvery(ctx, from.Netns, "tcp", addr, []*netns.Pod{next}, since, flipGap)
		if err != nil {
			t.Fatalf("flip %d: %v", i, err)
		}
		res.flips = append(res.flips, d)
		cur = next
	}
	stopProf()
	t.Logf("endpoint change until traffic follows: p50 %v, max %v", res.flipP50(), res.flipMax())

	// Warm restart: the rules stay in the kernel while the agent is away.
	killed := time.Now()
	c.KillAgent(node)
	<-node.Agent().Done()
	stopProf = prof.cpu(ctx, "warm-restart", 5)
	if err := c.StartAgent(ctx, node); err != nil {
		t.Fatal(err)
	}
	res.warm = time.Since(killed)
	res.fullSync, res.fullSyncCPU = fullSyncSeconds(ctx, t, node)
	stopProf()
	if err := flipOnce(ctx, c, probe, from, &cur, podA, podB); err != nil {
		t.Fatalf("flip after a warm restart: %v", err)
	}

	// Cold restart: the node's rules are gone as after a reboot.
	loop.pause()
	killed = time.Now()
	c.KillAgent(node)
	<-node.Agent().Done()
	if out, err := nsutil.Exec(ctx, node.Netns, c.AgentArgs(node)[0], "cleanup"); err != nil {
		t.Fatalf("agent cleanup: %v: %s", err, out)
	}
	cleaned := time.Since(killed)
	started := time.Now()
	stopProf = prof.cpu(ctx, "cold-restart", 5)
	if err := c.StartAgent(ctx, node); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.WaitBackends(ctx, from.Netns, "tcp", addr, []*netns.Pod{cur}, started); err != nil {
		t.Fatalf("after a cold restart: %v", err)
	}
	res.cold = time.Since(started)
	res.coldFullSync, res.coldFullSyncCPU = fullSyncSeconds(ctx, t, node)
	stopProf()
	t.Logf("cold restart: cleanup %v, start until the Service answers %v", cleaned.Round(time.Millisecond), res.cold.Round(time.Millisecond))
	loop.resume()
	if err := flipOnce(ctx, c, probe, from, &cur, podA, podB); err != nil {
		t.Fatalf("flip after a cold restart: %v", err)
	}

	res.requests, res.failed, res.firstFailure = loop.stop()
	res.load[1] = loadAvg()
	t.Log(res.table())
	if k.report != "" {
		if err := res.appendTo(k.report); err != nil {
			t.Error(err)
		}
	}
	if res.failed > 0 {
		t.Errorf("%d of %d requests failed; the first: %s", res.failed, res.requests, res.firstFailure)
	}
}

// flipOnce moves the probe Service to the other pod and waits for traffic.
func flipOnce(ctx context.Context, c *netns.Cluster, probe *v1.Service, from *netns.Pod, cur **netns.Pod, a, b *netns.Pod) error {
	next := a
	if *cur == a {
		next = b
	}
	since := time.Now()
	if err := c.SetEndpoints(ctx, probe, netns.Ready(next)); err != nil {
		return err
	}
	_, err := netns.WaitBackends(ctx, from.Netns, "tcp", net.JoinHostPort(probe.Spec.ClusterIP, "80"), []*netns.Pod{next}, since)
	*cur = next
	return err
}

func probeService() *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "probe"},
		Spec: v1.ServiceSpec{
			Type:  v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(netns.PortHTTP)}},
		},
	}
}

// createServices writes k.services Services, each with one EndpointSlice
// of k.endpoints ready endpoints. The endpoints are unique addresses in
// 100.64.0.0/10 that nothing answers: they make the rules, and the probe
// Service carries the traffic.
func createServices(ctx context.Context, t *testing.T, client kubernetes.Interface, k knobs) {
	t.Helper()
	const workers = 16
	next := make(chan int)
	var failed atomic.Value
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := retry(ctx, func() error { return createOne(ctx, client, i, k.endpoints) }); err != nil {
					failed.CompareAndSwap(nil, err)
				}
			}
		})
	}
	for i := range k.services {
		if failed.Load() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("creating Services: %v", err)
	}
}

func createOne(ctx context.Context, client kubernetes.Interface, i, endpoints int) error {
	name := fmt.Sprintf("s-%05d", i)
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: v1.ServiceSpec{
			Type:  v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if _, err := client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-x", Namespace: svc.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: netns.ManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	base := netip.MustParseAddr("100.64.0.0").As4()
	for j := range endpoints {
		n := uint32(i)*uint32(endpoints) + uint32(j) + 1
		a := base
		a[1] += byte(n >> 16)
		a[2] = byte(n >> 8)
		a[3] = byte(n)
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.AddrFrom4(a).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To("node-2"),
		})
	}
	_, err := client.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, es, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // an earlier try that timed out had made it
	}
	return err
}

// retry runs write until it succeeds, up to 5 times, while the apiserver
// is busy (timeouts, 429, 5xx): a loaded machine must slow the run down,
// not fail it.
func retry(ctx context.Context, write func() error) error {
	var err error
	for try := range 5 {
		if err = write(); err == nil || !(apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) ||
			apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) ||
			errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(1<<try) * time.Second):
		}
	}
	return err
}

// loop sends one request after the other (each a new connection) and
// counts failures; pause stops counting while the test breaks the node on
// purpose.
type loop struct {
	ok, failed atomic.Int64
	paused     atomic.Bool
	first      atomic.Value
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	once       sync.Once
}

func startLoop(ctx context.Context, from, addr string) *loop {
	ctx, cancel := context.WithCancel(ctx)
	l := &loop{cancel: cancel}
	l.wg.Go(func() {
		for ctx.Err() == nil {
			if l.paused.Load() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			_, err := nsutil.Request(ctx, from, "tcp", addr)
			switch {
			case ctx.Err() != nil, l.paused.Load():
			case err != nil:
				l.failed.Add(1)
				l.first.CompareAndSwap(nil, fmt.Sprintf("%s: %v", time.Now().Format(time.StampMilli), err))
			default:
				l.ok.Add(1)
			}
		}
	})
	return l
}

func (l *loop) pause()  { l.paused.Store(true) }
func (l *loop) resume() { l.paused.Store(false) }

func (l *loop) stop() (requests, failed int64, first string) {
	l.once.Do(func() {
		l.cancel()
		l.wg.Wait()
	})
	first, _ = l.first.Load().(string)
	return l.ok.Load() + l.failed.Load(), l.failed.Load(), first
}

// agentMetrics reads node's agent's /metrics (from inside its namespace)
// as name -> value, for metrics without labels.
func agentMetrics(ctx context.Context, t *testing.T, node *netns.Node) map[string]float64 {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: nsutil.Dialer(node.Netns), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", netns.MetricsPort), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("agent metrics: %v", err)
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

// fullSyncSeconds waits for the agent's first full sync since its start
// and returns its duration (the agent's own histogram) and the CPU time
// it spent (onehop_sync_cpu_seconds_total): on a busy machine the sync
// waits for a CPU for part of its duration.
func fullSyncSeconds(ctx context.Context, t *testing.T, node *netns.Node) (wall, cpu float64) {
	t.Helper()
	for range 600 {
		m := agentMetrics(ctx, t, node)
		if n := m["kubeproxy_sync_full_proxy_rules_duration_seconds_count"]; n >= 1 {
			return m["kubeproxy_sync_full_proxy_rules_duration_seconds_sum"] / n, m[`onehop_sync_cpu_seconds_total{mode="full"}`] / n
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no full sync in 60 s after the agent started")
	return 0, 0
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(p*float64(len(s)-1))]
}
