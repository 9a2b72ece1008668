package semantics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestSemantics runs issue 4's end-to-end cases against one namespace
// cluster: two nodes with two pods each, real kube-apiserver, real agents.
// Latencies (API write -> traffic following) are logged, never asserted.
func TestSemantics(t *testing.T) {
	began := time.Now()
	c := netns.NewForTest(t, netns.Config{})
	t.Logf("cluster %s up in %v", c.ID, time.Since(began).Round(time.Millisecond))
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *netns.Cluster)
	}{
		{"SessionAffinity", testAffinity},
		{"ExternalTrafficPolicyLocal", testExternalLocal},
		{"HealthCheckPortBusyEvent", testHealthCheckPortBusy},
		{"TerminatingFallback", testTerminatingFallback},
		{"LoadBalancerSourceRanges", testSourceRanges},
		{"UDPEndpointCycle", testUDPCycle},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c) })
	}
	t.Logf("semantics cases took %v", time.Since(began).Round(time.Millisecond))
}

// askN sends n fresh requests (new source port each) and counts answers
// by pod; any failure fails the test.
func askN(t *testing.T, from, proto, addr string, n int) map[string]int {
	t.Helper()
	ctx := ctxFor(t)
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		rep, err := nsutil.Request(ctx, from, proto, addr)
		if err != nil {
			t.Fatalf("%s %s from %s: %v", proto, addr, from, err)
		}
		seen[rep.Name]++
	}
	return seen
}

// waitSticky polls until need fresh requests in a row reach one pod and
// returns that pod and the time since since.
func waitSticky(t *testing.T, from, proto, addr string, need int, since time.Time) (string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxFor(t), netns.ConvergeTimeout)
	defer cancel()
	var (
		pod         string
		streak      int
		streakStart time.Time
		last        string
	)
	for {
		at := time.Now()
		rep, err := nsutil.Request(ctx, from, proto, addr)
		switch {
		case err != nil:
			streak, last = 0, err.Error()
		case streak > 0 && rep.Name == pod:
			streak++
		default:
			pod, streak, streakStart = rep.Name, 1, at
			last = "switched to " + rep.Name
		}
		if streak >= need {
			return pod, streakStart.Sub(since)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s %s from %s: never %d answers in a row from one pod within %v; last: %s", proto, addr, from, need, netns.ConvergeTimeout, last)
		}
	}
}

// sessionAffinity: ClientIP keeps each client on one endpoint; switching it
// off at run time spreads the client again, switching it back on sticks.
func testAffinity(t *testing.T, c *netns.Cluster) {
	pods := c.Pods()
	s := service("sticky", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](10800)}}
	svc, since := expose(t, c, s, netns.Ready(pods...))
	addr := hostPort(svc.Spec.ClusterIP, 80)

	for _, from := range []*netns.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[1]} {
		_, d := waitAnswer(t, from.Netns, "tcp", addr, since)
		logLatency(t, "affinity service answers "+from.Name, d)
		seen := askN(t, from.Netns, "tcp", addr, 40)
		if len(seen) != 1 {
			t.Errorf("sessionAffinity ClientIP: 40 fresh connections from %s reached %v, want one pod", from.Name, seen)
		} else {
			t.Logf("40 connections from %s all reached %v", from.Name, seen)
		}
	}

	from := c.Nodes[0].Pods[0]
	updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityNone
		s.Spec.SessionAffinityConfig = nil
	})
	d, err := netns.WaitBackends(ctxFor(t), from.Netns, "tcp", addr, pods, time.Now())
	if err != nil {
		t.Fatalf("affinity switched off: %v", err)
	}
	logLatency(t, "affinity off -> spread over all 4 endpoints", d)

	updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	})
	pod, d := waitSticky(t, from.Netns, "tcp", addr, 30, time.Now())
	logLatency(t, "affinity on again -> 30 in a row on "+pod, d)
	if seen := askN(t, from.Netns, "tcp", addr, 30); len(seen) != 1 || seen[pod] != 30 {
		t.Errorf("after switching affinity back on, 30 more connections reached %v, want all on %s", seen, pod)
	}
}

// isDrop reports whether err is a timeout (packets dropped) rather than a
// refusal.
func isDrop(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// waitClientSource polls until need answers in a row through addr saw the
// external client's own address, and fails otherwise.
func waitClientSource(t *testing.T, c *netns.Cluster, addr string, want []*netns.Pod, need int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxFor(t), netns.ConvergeTimeout)
	defer cancel()
	allowed := map[string]bool{}
	for _, p := range want {
		allowed[p.Name] = true
	}
	began := time.Now()
	streak, last := 0, ""
	for streak < need {
		rep, err := nsutil.Request(ctx, c.ClientNetns, "tcp", addr)
		switch {
		case err != nil:
			streak, last = 0, err.Error()
		case !allowed[rep.Name]:
			streak, last = 0, "answered by "+rep.Name+", not a local endpoint"
		case rep.SourceIP() != netns.ClientIP().String():
			streak, last = 0, fmt.Sprintf("%s saw source %s, not the client's %s", rep.Name, rep.SourceIP(), netns.ClientIP())
		default:
			streak++
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: no %d answers in a row from %v seeing the client's address within %v; last: %s",
				addr, need, podNames(want), netns.ConvergeTimeout, last)
		}
	}
	return time.Since(began)
}

// externalTrafficPolicy Local: the client's address reaches the pod, a node
// without local endpoints drops, and the health-check node port tells load
// balancers which node to use.
func testExternalLocal(t *testing.T, c *netns.Cluster) {
	node1, node2 := c.Nodes[0], c.Nodes[1]
	svc, since := expose(t, c, service("local", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), netns.Ready(node1.Pods...))
	np := svc.Spec.Ports[0].NodePort
	// Cluster policy first: node 2 forwards to node 1's pods, so a later
	// silence on node 2 is the policy, not a NodePort node 2 never had.
	d, err := netns.WaitBackends(ctxFor(t), c.ClientNetns, "tcp", hostPort(node2.IP, np), node1.Pods, since)
	if err != nil {
		t.Fatalf("Cluster policy via node 2: %v", err)
	}
	logLatency(t, "Cluster policy NodePort via node without endpoints", d)

	switched := time.Now()
	svc = updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("the API server allocated no healthCheckNodePort for a Local LoadBalancer Service")
	}

	t.Run("SourceIPKept", func(t *testing.T) {
		d := waitClientSource(t, c, hostPort(node1.IP, np), node1.Pods, 20)
		logLatency(t, "Local: 20 answers in a row seeing the client's address (since polling began)", d)
		t.Logf("since the switch to Local: %v", time.Since(switched).Round(time.Millisecond))
	})
	t.Run("NoLocalEndpointDrops", func(t *testing.T) {
		addr := hostPort(node2.IP, np)
		d, err := netns.WaitUnserved(ctxFor(t), c.ClientNetns, "tcp", addr, switched)
		if err != nil {
			t.Fatalf("node without local endpoints: %v", err)
		}
		logLatency(t, "Local: node without local endpoints stops answering", d)
		_, err = nsutil.Request(ctxFor(t), c.ClientNetns, "tcp", addr)
		if err == nil || !isDrop(err) {
			t.Errorf("NodePort on a node without local endpoints: %v, want the connection dropped (timeout), as kube-proxy", err)
		}
	})
	t.Run("HealthCheckNodePort", func(t *testing.T) {
		polled := time.Now() // the previous subtests took a while since the switch
		ok := waitHealth(t, c, node1, hc, http.StatusOK, 2, polled)
		checkHealthAnswer(t, ok, svc, 2)
		bad := waitHealth(t, c, node2, hc, http.StatusServiceUnavailable, 0, polled)
		checkHealthAnswer(t, bad, svc, 0)

		// The endpoints move to node 2: the answers swap, and so does traffic.
		moved := time.Now()
		if err := c.SetEndpoints(ctxFor(t), svc, netns.Ready(node2.Pods...)); err != nil {
			t.Fatal(err)
		}
		checkHealthAnswer(t, waitHealth(t, c, node1, hc, http.StatusServiceUnavailable, 0, moved), svc, 0)
		checkHealthAnswer(t, waitHealth(t, c, node2, hc, http.StatusOK, 2, moved), svc, 2)
		d := waitClientSource(t, c, hostPort(node2.IP, np), node2.Pods, 10)
		logLatency(t, "endpoints moved: node 2 serves with the client's address", d)
		d, err := netns.WaitUnserved(ctxFor(t), c.ClientNetns, "tcp", hostPort(node1.IP, np), moved)
		if err != nil {
			t.Fatalf("node 1 after its endpoints left: %v", err)
		}
		logLatency(t, "endpoints moved: node 1 stops answering", d)

		// Back to Cluster: the health-check port goes away.
		updateService(t, c, svc, func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
			s.Spec.HealthCheckNodePort = 0
		})
		waitHealthGone(t, c, node2, hc)
	})
}

// healthAnswer is one answer of a health-check node port.
type healthAnswer struct {
	code   int
	header http.Header
	raw    string
	body   struct {
		Service struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
		LocalEndpoints      int  `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}
}

func getHealth(c *netns.Cluster, n *netns.Node, hc int32) (healthAnswer, error) {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{DialContext: nsutil.Dialer(c.ClientNetns), DisableKeepAlives: true},
	}
	resp, err := client.Get(fmt.Sprintf("http://%s/healthz", hostPort(n.IP, hc)))
	if err != nil {
		return healthAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return healthAnswer{}, err
	}
	a := healthAnswer{code: resp.StatusCode, header: resp.Header, raw: string(b)}
	if err := json.Unmarshal(b, &a.body); err != nil {
		return a, fmt.Errorf("body %q: %w", b, err)
	}
	return a, nil
}

// waitHealth polls node n's health-check node port from the external
// client until it answers code with local endpoints count.
func waitHealth(t *testing.T, c *netns.Cluster, n *netns.Node, hc int32, code, count int, since time.Time) healthAnswer {
	t.Helper()
	deadline := time.Now().Add(netns.ConvergeTimeout)
	var last string
	for time.Now().Before(deadline) {
		a, err := getHealth(c, n, hc)
		if err == nil && a.code == code && a.body.LocalEndpoints == count {
			logLatency(t, fmt.Sprintf("health check %s:%d answers %d with %d local endpoints", n.Name, hc, code, count), time.Since(since))
			return a
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", a.code, a.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("health check node port %d on %s: want %d with localEndpoints %d within %v; last: %s", hc, n.Name, code, count, netns.ConvergeTimeout, last)
	return healthAnswer{}
}

func checkHealthAnswer(t *testing.T, a healthAnswer, svc *v1.Service, count int) {
	t.Helper()
	if a.body.Service.Namespace != svc.Namespace || a.body.Service.Name != svc.Name || !a.body.ServiceProxyHealthy {
		t.Errorf("health check body %s: want service %s/%s and serviceProxyHealthy true", a.raw, svc.Namespace, svc.Name)
	}
	for h, want := range map[string]string{
		"Content-Type":                     "application/json",
		"X-Content-Type-Options":           "nosniff",
		"X-Load-Balancing-Endpoint-Weight": fmt.Sprint(count),
	} {
		if got := a.header.Get(h); got != want {
			t.Errorf("health check header %s = %q, want %q", h, got, want)
		}
	}
}

func waitHealthGone(t *testing.T, c *netns.Cluster, n *netns.Node, hc int32) {
	t.Helper()
	began := time.Now()
	for time.Since(began) < netns.ConvergeTimeout {
		if _, err := getHealth(c, n, hc); err != nil {
			logLatency(t, fmt.Sprintf("health check port %d on %s closed after the Service went back to Cluster", hc, n.Name), time.Since(began))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("health check port %d on %s still answers %v after the Service went back to Cluster", hc, n.Name, netns.ConvergeTimeout)
}

// Terminating endpoints serve only when no endpoint is ready, and then only
// those still serving.
func testTerminatingFallback(t *testing.T, c *netns.Cluster) {
	a, b, x := c.Nodes[0].Pods[0], c.Nodes[0].Pods[1], c.Nodes[1].Pods[0]
	from := c.Nodes[1].Pods[1]
	terminating := func(p *netns.Pod, serving bool) netns.Endpoint {
		return netns.Endpoint{Pod: p, Terminating: true, Serving: serving}
	}
	svc, _ := expose(t, c, service("draining", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), netns.Ready(a, b, x))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	steps := []struct {
		what string
		eps  []netns.Endpoint
		want []*netns.Pod
	}{
		{"all ready", netns.Ready(a, b, x), []*netns.Pod{a, b, x}},
		{"one ready, one terminating+serving, one terminating: only the ready one",
			[]netns.Endpoint{{Pod: a}, terminating(b, true), terminating(x, false)}, []*netns.Pod{a}},
		{"none ready: the terminating+serving ones, not the non-serving one",
			[]netns.Endpoint{terminating(a, true), terminating(b, true), terminating(x, false)}, []*netns.Pod{a, b}},
		{"none serving: no traffic",
			[]netns.Endpoint{terminating(a, false), terminating(b, false), terminating(x, false)}, nil},
		{"a ready one appears: it alone", []netns.Endpoint{terminating(a, true), {Pod: x}}, []*netns.Pod{x}},
	}
	for _, s := range steps {
		at := time.Now()
		if err := c.SetEndpoints(ctxFor(t), svc, s.eps); err != nil {
			t.Fatal(err)
		}
		d, err := netns.WaitBackends(ctxFor(t), from.Netns, "tcp", addr, s.want, at)
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		logLatency(t, s.what, d)
	}
}

// loadBalancerSourceRanges: once set, the allowed client still reaches the
// LB IP and another external host (the router, 192.0.2.1) no longer does;
// removing them lets it in again.
func testSourceRanges(t *testing.T, c *netns.Cluster) {
	pods := c.Pods()
	svc, _ := expose(t, c, service("fenced", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), netns.Ready(pods...))
	ingress := netns.ExternalIP(41).String() // routed to node 1
	if _, err := c.SetLoadBalancerIngress(ctxFor(t), svc, ingress); err != nil {
		t.Fatal(err)
	}
	addr := hostPort(ingress, 80)
	since := time.Now()
	d, err := netns.WaitBackends(ctxFor(t), c.ClientNetns, "tcp", addr, pods, since)
	if err != nil {
		t.Fatal(err)
	}
	logLatency(t, "LB IP from the client, no source ranges", d)
	_, d = waitAnswer(t, c.Router, "tcp", addr, since)
	logLatency(t, "LB IP from the router, no source ranges", d)

	set := time.Now()
	updateService(t, c, svc, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{netns.ClientIP().String() + "/32"}
	})
	d, err = netns.WaitUnserved(ctxFor(t), c.Router, "tcp", addr, set)
	if err != nil {
		t.Fatalf("source ranges %s/32: the router (not in them): %v", netns.ClientIP(), err)
	}
	logLatency(t, "source ranges set: router refused", d)
	// Checked once the router is refused, i.e. once the ranges are in force.
	if d, err = netns.WaitBackends(ctxFor(t), c.ClientNetns, "tcp", addr, pods, time.Now()); err != nil {
		t.Fatalf("source ranges %s/32: the client (in them): %v", netns.ClientIP(), err)
	}
	logLatency(t, "source ranges in force: client still reaches every endpoint (polling time)", d)

	cleared := time.Now()
	updateService(t, c, svc, func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = nil })
	_, d = waitAnswer(t, c.Router, "tcp", addr, cleared)
	logLatency(t, "source ranges removed: router reaches again", d)
}

// udpSender keeps one UDP socket (one conntrack entry) sending from a pod
// and records who answers.
type udpSender struct {
	mu      sync.Mutex
	answers []udpAnswer
	stop    chan struct{}
	done    chan struct{}
}

type udpAnswer struct {
	at  time.Time
	pod string // "" for no answer
}

func startUDPSender(t *testing.T, from *netns.Pod, addr string) *udpSender {
	t.Helper()
	conn, err := nsutil.Dialer(from.Netns)(ctxFor(t), "udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &udpSender{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close()
		buf := make([]byte, 4096)
		for i := 0; ; i++ {
			select {
			case <-s.stop:
				return
			default:
			}
			_, _ = fmt.Fprintf(conn, "ping %d\n", i)
			_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			a := udpAnswer{}
			if n, err := conn.Read(buf); err == nil {
				var rep nsutil.Reply
				if json.Unmarshal([]byte(strings.TrimSpace(string(buf[:n]))), &rep) == nil {
					a.pod = rep.Name
				}
			} else if !isDrop(err) {
				time.Sleep(50 * time.Millisecond) // ICMP error: rejected
			}
			a.at = time.Now()
			s.mu.Lock()
			s.answers = append(s.answers, a)
			s.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { close(s.stop); <-s.done })
	return s
}

// waitStreak waits until need answers in a row (after since) are from pod
// ("" = unanswered) and returns when the streak began, relative to since.
func (s *udpSender) waitStreak(t *testing.T, pod string, need int, since time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(netns.ConvergeTimeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		streak := 0
		var start time.Time
		for _, a := range s.answers {
			if a.at.Before(since) {
				continue
			}
			if a.pod == pod {
				if streak == 0 {
					start = a.at
				}
				streak++
				if streak >= need {
					s.mu.Unlock()
					return start.Sub(since)
				}
			} else {
				streak = 0
			}
		}
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the running UDP flow never had %d answers in a row from %q within %v; since the change: %s", need, pod, netns.ConvergeTimeout, s.summary(since))
	return 0
}

func (s *udpSender) summary(since time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	counts := map[string]int{}
	for _, a := range s.answers {
		if !a.at.Before(since) {
			k := a.pod
			if k == "" {
				k = "(none)"
			}
			counts[k]++
		}
	}
	return fmt.Sprint(counts)
}

// A UDP flow from a pod keeps sending (one socket, one conntrack entry)
// while the Service's endpoint is replaced, removed (1 -> 0) and restored
// (0 -> 1). Without conntrack cleanup the entry would keep the flow on the
// old pod, which still answers here.
func testUDPCycle(t *testing.T, c *netns.Cluster) {
	from := c.Nodes[0].Pods[0]
	x, y := c.Nodes[1].Pods[0], c.Nodes[1].Pods[1]
	svc, since := expose(t, c, service("udpcycle", v1.ServiceTypeClusterIP, port("dns", v1.ProtocolUDP, 53, netns.PortDNS)), netns.Ready(x))
	addr := hostPort(svc.Spec.ClusterIP, 53)
	if _, err := netns.WaitBackends(ctxFor(t), from.Netns, "udp", addr, []*netns.Pod{x}, since); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	s := startUDPSender(t, from, addr)
	logLatency(t, "sender's flow answered by "+x.Name, s.waitStreak(t, x.Name, 5, started))

	for _, step := range []struct {
		what string
		eps  []*netns.Pod
		want string
	}{
		{"endpoint replaced " + x.Name + " -> " + y.Name, []*netns.Pod{y}, y.Name},
		{"scaled 1 -> 0", nil, ""},
		{"scaled 0 -> 1 (" + x.Name + ")", []*netns.Pod{x}, x.Name},
	} {
		at := time.Now()
		if err := c.SetEndpoints(ctxFor(t), svc, netns.Ready(step.eps...)); err != nil {
			t.Fatal(err)
		}
		d := s.waitStreak(t, step.want, 10, at)
		logLatency(t, step.what+": the running flow follows", d)
	}
}

// A health-check node port that cannot be bound (something on the node holds
// it) gives a Warning event on the Service; once the port is free, the next
// sync serves it.
func testHealthCheckPortBusy(t *testing.T, c *netns.Cluster) {
	ctx := ctxFor(t)
	node1 := c.Nodes[0]
	const hc = 32123
	squatter, err := nsutil.Listen(node1.Netns, "tcp", fmt.Sprintf(":%d", hc))
	if err != nil {
		t.Fatalf("hold port %d on %s: %v", hc, node1.Name, err)
	}
	defer squatter.Close()

	s := service("squatted", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = hc
	svc, since := expose(t, c, s, netns.Ready(node1.Pods...))
	if svc.Spec.HealthCheckNodePort != hc {
		t.Fatalf("healthCheckNodePort %d, asked for %d", svc.Spec.HealthCheckNodePort, hc)
	}

	var found *v1.Event
	for found == nil && time.Since(since) < netns.ConvergeTimeout {
		evs, err := c.Client.CoreV1().Events(svc.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Service,involvedObject.name=" + svc.Name,
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range evs.Items {
			if e.Reason == "FailedToStartServiceHealthcheck" && e.Type == v1.EventTypeWarning {
				found = &evs.Items[i]
			}
		}
		if found == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if found == nil {
		t.Fatalf("no Warning FailedToStartServiceHealthcheck event on service %s within %v while %s held port %d",
			svc.Name, netns.ConvergeTimeout, node1.Name, hc)
	}
	logLatency(t, "event on the Service", time.Since(since))
	t.Logf("event: %s %s (source %s): %s", found.Type, found.Reason, found.Source.Host, found.Message)
	if found.Source.Host != node1.Name || !strings.Contains(found.Message, fmt.Sprint(hc)) {
		t.Errorf("event from %q with message %q: want it from %s naming port %d", found.Source.Host, found.Message, node1.Name, hc)
	}
	if found.InvolvedObject.UID != svc.UID {
		t.Logf("note: the event's involvedObject has UID %q, the Service %q: `kubectl describe service` lists events by UID", found.InvolvedObject.UID, svc.UID)
	}

	// Free the port; any later sync (here: an endpoint change) serves it.
	squatter.Close()
	freed := time.Now()
	if err := c.SetEndpoints(ctx, svc, netns.Ready(node1.Pods[0])); err != nil {
		t.Fatal(err)
	}
	checkHealthAnswer(t, waitHealth(t, c, node1, hc, http.StatusOK, 1, freed), svc, 1)
}
