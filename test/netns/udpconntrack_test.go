package netns_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// A UDP flow has no handshake: while its conntrack entry lives (refreshed
// by every datagram) each datagram follows the NAT decision the entry
// pinned when the flow began. These cases keep one flow per client (one
// fixed source port) sending across a Service change made through the API,
// and want the flow to follow the change as kube-proxy users expect: the
// agent deletes the entries the change left pointing the wrong way.
//
// The deadlines are liveness bounds (flowDeadline), far below conntrack's
// UDP timeouts (30 s, 120 s once a flow is assured), which a flow sending
// every 100 ms never reaches: without the cleanup the old decision would
// hold for as long as the flow runs.
func TestUDPConntrack(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{})
	lat := &latencies{}
	t.Cleanup(func() { lat.log(t) })
	run := func(name string, fn func(*testing.T, *netns.Cluster, *latencies)) {
		t.Run(name, func(t *testing.T) { fn(t, c, lat) })
	}
	// First: its cluster IP and NodePort are fixed, and free while no
	// other case has taken addresses.
	run("CreatedWhileSending", testUDPCreatedWhileSending)
	soon := newCleanTrigger(t, c)
	run("ServiceDeleted", testUDPServiceDeleted(nil))
	run("ServiceDeletedSoonAfterEndpoints", testUDPServiceDeleted(soon))
	run("ScaledToZero", testUDPScaledToZero(nil))
	run("ScaledToZeroSoonAfterEndpoints", testUDPScaledToZero(soon))
	run("EndpointReplaced", testUDPEndpointReplaced)
	run("EndpointGoneOthersRemain", testUDPEndpointGoneOthersRemain)
	run("TerminatingServingKeepsFlow", testUDPTerminatingServingKeepsFlow)
	run("InternalTrafficPolicyFlipKeepsFlow", testUDPInternalPolicyFlipKeepsFlow)
}

// flowDeadline bounds how long a running flow may take to follow a change.
const flowDeadline = 10 * time.Second

// flowGap is the pause between a flow's datagrams.
const flowGap = 100 * time.Millisecond

// pollGap is the pause between two looks at a flow's outcomes.
const pollGap = 10 * time.Millisecond

// flowOutcome is what became of one datagram of a flow.
type flowOutcome struct {
	at      time.Time // when it was sent
	pod     string    // the pod that answered; "" when none did
	refused bool      // an ICMP error came back (rejected)
}

func (o flowOutcome) String() string {
	switch {
	case o.pod != "":
		return o.pod
	case o.refused:
		return "refused"
	}
	return "-"
}

// udpFlow sends a datagram every flowGap from one socket (one source port,
// so one conntrack entry) and records what became of each.
type udpFlow struct {
	name string
	mu   sync.Mutex
	outs []flowOutcome
	stop chan struct{}
	done chan struct{}
}

// startUDPFlow keeps sending from namespace from to addr, from a new
// source port (srcPort), until the test ends.
func startUDPFlow(t *testing.T, name, from, addr string) *udpFlow {
	t.Helper()
	return goFlow(t, name, from, addr, false)
}

// startServedUDPFlow is startUDPFlow for an address that is being served:
// until a datagram is answered each goes from a new socket, so that the
// flow begins on the rules the node has when it answers, not on a
// conntrack entry made before them; from the first answer on it keeps to
// that socket.
func startServedUDPFlow(t *testing.T, name, from, addr string) *udpFlow {
	t.Helper()
	return goFlow(t, name, from, addr, true)
}

func goFlow(t *testing.T, name, from, addr string, served bool) *udpFlow {
	t.Helper()
	dial := func() (net.Conn, error) {
		var conn net.Conn
		port := srcPort()
		err := nsutil.Do(from, func() error {
			d := net.Dialer{LocalAddr: &net.UDPAddr{Port: port}}
			var err error
			conn, err = d.Dial("udp", addr)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%s: UDP socket in %s from port %d to %s: %w", name, from, port, addr, err)
		}
		return conn, nil
	}
	conn, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	f := &udpFlow{name: name, stop: make(chan struct{}), done: make(chan struct{})}
	var redial func() (net.Conn, error)
	if served {
		redial = dial
	}
	go f.run(conn, redial)
	t.Cleanup(f.close)
	return f
}

// run sends until stopped; with redial, datagrams go from a new socket
// until one is answered.
func (f *udpFlow) run(c net.Conn, redial func() (net.Conn, error)) {
	defer close(f.done)
	defer func() { c.Close() }()
	buf := make([]byte, 1024)
	for {
		select {
		case <-f.stop:
			return
		default:
		}
		gap := flowGap
		if redial != nil {
			gap = flowGap / 4
		}
		o := flowOutcome{at: time.Now()}
		_ = c.SetDeadline(o.at.Add(gap))
		_, err := c.Write([]byte("hello\n"))
		for err == nil {
			var n int
			if n, err = c.Read(buf); err == nil {
				var r nsutil.Reply
				if json.Unmarshal(buf[:n], &r) == nil && r.Name != "" {
					o.pod = r.Name
					break
				}
			}
		}
		o.refused = errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
			errors.Is(err, syscall.ENETUNREACH)
		f.mu.Lock()
		f.outs = append(f.outs, o)
		f.mu.Unlock()
		switch {
		case redial == nil:
		case o.pod != "":
			redial = nil // served: this socket is the flow
		default:
			if next, err := redial(); err == nil {
				c.Close()
				c = next
			}
		}
		time.Sleep(time.Until(o.at.Add(gap)))
	}
}

func (f *udpFlow) close() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
}

// waitStreak waits until flowDeadline after since (after now when since
// is zero) for n datagrams in a row sent after since whose outcome
// satisfies ok, and returns how long after since the first of them was
// sent. When none came it marks t failed and returns false. The flows of a
// case run side by side, so each is given the same time after the change.
func (f *udpFlow) waitStreak(t *testing.T, what string, since time.Time, n int, ok func(flowOutcome) bool) (time.Duration, bool) {
	t.Helper()
	deadline := since.Add(flowDeadline)
	if since.IsZero() {
		deadline = time.Now().Add(flowDeadline)
	}
	for {
		f.mu.Lock()
		streak := 0
		for _, o := range f.outs {
			if o.at.Before(since) {
				continue
			}
			if !ok(o) {
				streak = 0
				continue
			}
			if streak++; streak == n {
				// the streak's first datagram
				d := o.at.Add(-time.Duration(n-1) * flowGap).Sub(since)
				f.mu.Unlock()
				return max(d, 0), true
			}
		}
		f.mu.Unlock()
		if time.Now().After(deadline) {
			t.Errorf("flow %s: %s: no %d datagrams in a row did so within %v; outcomes since the change: %s",
				f.name, what, n, flowDeadline, f.summary(since))
			return 0, false
		}
		time.Sleep(pollGap)
	}
}

// reaches waits until the flow is answered by pod, steadily.
func (f *udpFlow) reaches(t *testing.T, pod *netns.Pod, since time.Time) (time.Duration, bool) {
	t.Helper()
	return f.waitStreak(t, "reach "+pod.Name, since, 5, func(o flowOutcome) bool { return o.pod == pod.Name })
}

// undelivered waits until the flow's datagrams reach no pod, steadily.
func (f *udpFlow) undelivered(t *testing.T, since time.Time) (time.Duration, bool) {
	t.Helper()
	return f.waitStreak(t, "reach no pod", since, 10, func(o flowOutcome) bool { return o.pod == "" })
}

// followed returns a function that records, as what, how long a flow took
// to follow a change, when it did.
func followed(t *testing.T, lat *latencies, what string) func(time.Duration, bool) {
	return func(d time.Duration, ok bool) {
		if ok {
			lat.add(t, what, d)
		}
	}
}

// refused counts the flow's datagrams sent after since that were refused.
func (f *udpFlow) refused(since time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, o := range f.outs {
		if !o.at.Before(since) && o.refused {
			n++
		}
	}
	return n
}

// answeredBy waits until the flow is answered by one pod steadily and
// returns that pod.
func (f *udpFlow) answeredBy(t *testing.T, c *netns.Cluster, since time.Time) *netns.Pod {
	t.Helper()
	deadline := time.Now().Add(flowDeadline)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		var last []string
		for _, o := range f.outs {
			if !o.at.Before(since) {
				last = append(last, o.pod)
			}
		}
		f.mu.Unlock()
		if n := len(last); n >= 5 && last[n-1] != "" && slices.Equal(last[n-5:n-1], []string{last[n-1], last[n-1], last[n-1], last[n-1]}) {
			for _, p := range c.Pods() {
				if p.Name == last[n-1] {
					return p
				}
			}
		}
		time.Sleep(flowGap)
	}
	t.Fatalf("flow %s: no steady answer within %v: %s", f.name, flowDeadline, f.summary(since))
	return nil
}

// summary lists the outcomes since since, run-length encoded.
func (f *udpFlow) summary(since time.Time) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.summaryLocked(since)
}

// summaryLocked is summary with f.mu held.
func (f *udpFlow) summaryLocked(since time.Time) string {
	var parts []string
	last, n := "", 0
	flush := func() {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s x%d", last, n))
		}
	}
	for _, o := range f.outs {
		if o.at.Before(since) {
			continue
		}
		if s := o.String(); s != last {
			flush()
			last, n = s, 0
		}
		n++
	}
	flush()
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ", ")
}

// udpService is a Service with one UDP port 53 to the pods' PortDNS.
func udpService(name string, typ v1.ServiceType) *v1.Service {
	return service(name, typ, port("dns", v1.ProtocolUDP, 53, netns.PortDNS))
}

// srcPort hands out the flows' source ports, a new one each time, so that
// no flow joins a conntrack entry that an earlier case left behind.
func srcPort() int { return 41000 + int(flowsStarted.Add(1)) }

var flowsStarted atomic.Int32

// flowSpec is one client of a case: the namespace it sends from and the
// Service's way in it sends to.
type flowSpec struct {
	name string
	from string
	to   func(svc *v1.Service) string
}

func toClusterIP(svc *v1.Service) string { return hostPort(svc.Spec.ClusterIP, 53) }

func toNodePort(n *netns.Node) func(*v1.Service) string {
	return func(svc *v1.Service) string { return hostPort(n.IP, svc.Spec.Ports[0].NodePort) }
}

// establish creates svc with target as its only endpoint, starts one flow
// per spec once the Service answers there, and returns when each flow has
// reached target. With soon, the agents have cleaned their conntrack
// tables just before (see cleanTrigger) and each flow counts as running at
// its first answer, so that what the caller changes next reaches the
// agents within the same second as the Service's endpoint did.
func establish(t *testing.T, c *netns.Cluster, svc *v1.Service, target *netns.Pod, specs []flowSpec, soon *cleanTrigger) (*v1.Service, []*udpFlow) {
	t.Helper()
	if soon != nil {
		soon.now(t)
	}
	created, since := expose(t, c, svc, []*netns.Pod{target})
	var flows []*udpFlow
	for _, s := range specs {
		flows = append(flows, startServedUDPFlow(t, s.name, s.from, s.to(created)))
	}
	streak := 5
	if soon != nil {
		streak = 1
	}
	for _, f := range flows {
		if _, ok := f.waitStreak(t, "reach "+target.Name, since, streak, func(o flowOutcome) bool { return o.pod == target.Name }); !ok {
			t.FailNow()
		}
	}
	return created, flows
}

// cleanTrigger makes the agents clean their conntrack tables at a known
// moment: an agent walks the table at most once a second, so changes that
// reach it within a second of a walk are cleaned together in the next one.
// A Service nobody sends to loses one of its two endpoints, which the
// agents clean at once when their last walk is more than a second old.
type cleanTrigger struct {
	c    *netns.Cluster
	svc  *v1.Service
	pods []*netns.Pod
}

func newCleanTrigger(t *testing.T, c *netns.Cluster) *cleanTrigger {
	pods := []*netns.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]}
	svc, _ := expose(t, c, udpService("udp-idle", v1.ServiceTypeClusterIP), pods)
	return &cleanTrigger{c: c, svc: svc, pods: pods}
}

func (ct *cleanTrigger) now(t *testing.T) {
	t.Helper()
	ctx := ctxFor(t)
	if err := ct.c.SetEndpoints(ctx, ct.svc, netns.Ready(ct.pods...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // more than a second since any walk
	if err := ct.c.SetEndpoints(ctx, ct.svc, netns.Ready(ct.pods[0])); err != nil {
		t.Fatal(err)
	}
}

// A Service is deleted while flows run to its cluster IP from pods and
// from the node itself: they stop reaching the old pod. With soon, the
// Service goes within a second of getting its endpoint.
func testUDPServiceDeleted(soon *cleanTrigger) func(*testing.T, *netns.Cluster, *latencies) {
	return func(t *testing.T, c *netns.Cluster, lat *latencies) {
		ctx := ctxFor(t)
		target := c.Nodes[1].Pods[0]
		svc, flows := establish(t, c, udpService("udp-gone", v1.ServiceTypeClusterIP), target, []flowSpec{
			{"from a pod on another node", c.Nodes[0].Pods[0].Netns, toClusterIP},
			{"from a pod on the same node", c.Nodes[1].Pods[1].Netns, toClusterIP},
			{"from the node itself", c.Nodes[1].Netns, toClusterIP},
		}, soon)
		if err := c.DeleteService(ctx, svc.Namespace, svc.Name); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		for _, f := range flows {
			followed(t, lat, "Service deleted -> flow "+f.name+" stops")(f.undelivered(t, deleted))
		}
	}
}

// The Service scales to zero while flows run through its cluster IP and
// its NodePort, from a pod and from the node itself: none is delivered any
// more (they are rejected, as a new flow would be). With soon, the Service
// scales to zero within a second of getting its endpoint.
func testUDPScaledToZero(soon *cleanTrigger) func(*testing.T, *netns.Cluster, *latencies) {
	return func(t *testing.T, c *netns.Cluster, lat *latencies) {
		ctx := ctxFor(t)
		node := c.Nodes[0]
		pod, target := node.Pods[0], c.Nodes[1].Pods[1]
		svc, flows := establish(t, c, udpService("udp-zero", v1.ServiceTypeNodePort), target, []flowSpec{
			{"ClusterIP from a pod", pod.Netns, toClusterIP},
			{"ClusterIP from the node", node.Netns, toClusterIP},
			{"NodePort from a pod", pod.Netns, toNodePort(node)},
			{"NodePort from the node", node.Netns, toNodePort(node)},
		}, soon)
		if err := c.SetEndpoints(ctx, svc, nil); err != nil {
			t.Fatal(err)
		}
		zero := time.Now()
		for _, f := range flows {
			followed(t, lat, "scaled to zero -> "+f.name+" not delivered")(f.undelivered(t, zero))
		}
		for _, f := range flows {
			t.Logf("flow %s after the scale to zero: %s (%d refused)", f.name, f.summary(zero), f.refused(zero))
		}
	}
}

// The Service's only endpoint is replaced by another pod: the running
// flows move to the new pod.
func testUDPEndpointReplaced(t *testing.T, c *netns.Cluster, lat *latencies) {
	node := c.Nodes[1]
	old, repl := c.Nodes[0].Pods[0], c.Nodes[0].Pods[1]
	svc, flows := establish(t, c, udpService("udp-moved", v1.ServiceTypeNodePort), old, []flowSpec{
		{"ClusterIP from a pod", node.Pods[0].Netns, toClusterIP},
		{"NodePort from the node", node.Netns, toNodePort(node)},
		{"NodePort from the client", c.ClientNetns, toNodePort(node)},
	}, nil)
	moveFlows(t, c, lat, svc, netns.Ready(repl), flows, repl, "endpoint replaced -> %s on the new pod")
}

// moveFlows gives svc the endpoints eps and waits until each flow reaches
// pod, recording how long it took as what (with the flow's name).
func moveFlows(t *testing.T, c *netns.Cluster, lat *latencies, svc *v1.Service, eps []netns.Endpoint, flows []*udpFlow, pod *netns.Pod, what string) {
	t.Helper()
	if err := c.SetEndpoints(ctxFor(t), svc, eps); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	for _, f := range flows {
		followed(t, lat, fmt.Sprintf(what, f.name))(f.reaches(t, pod, changed))
	}
}

// One of two endpoints goes away: the flow it served moves to the other.
func testUDPEndpointGoneOthersRemain(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	pod := c.Nodes[0].Pods[1]
	eps := []*netns.Pod{c.Nodes[0].Pods[0], c.Nodes[1].Pods[0]}
	svc, since := expose(t, c, udpService("udp-shrink", v1.ServiceTypeClusterIP), eps)
	vip := hostPort(svc.Spec.ClusterIP, 53)
	if _, err := netns.WaitBackends(ctx, pod.Netns, "udp", vip, eps, since); err != nil {
		t.Fatal(err)
	}
	f := startServedUDPFlow(t, "ClusterIP from a pod", pod.Netns, vip)
	gone := f.answeredBy(t, c, since)
	remain := eps[0]
	if remain == gone {
		remain = eps[1]
	}
	if err := c.SetEndpoints(ctx, svc, netns.Ready(remain)); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	followed(t, lat, "endpoint gone -> flow on the remaining pod")(f.reaches(t, remain, changed))
}

// Flows already send to a cluster IP and a NodePort before their Service
// exists: their datagrams are routed away or refused, and conntrack
// remembers that un-NATed. Once the Service is created with an endpoint the
// flows reach it.
func testUDPCreatedWhileSending(t *testing.T, c *netns.Cluster, lat *latencies) {
	node := c.Nodes[0]
	pod, target := node.Pods[1], c.Nodes[1].Pods[1]
	const clusterIP, nodePort = "10.96.53.53", 31053
	vip := hostPort(clusterIP, 53)
	flows := []*udpFlow{
		startUDPFlow(t, "ClusterIP from a pod", pod.Netns, vip),
		startUDPFlow(t, "ClusterIP from the node", node.Netns, vip),
		startUDPFlow(t, "NodePort from a pod", pod.Netns, hostPort(node.IP, nodePort)),
		startUDPFlow(t, "NodePort from the node", node.Netns, hostPort(node.IP, nodePort)),
		startUDPFlow(t, "NodePort from the client", c.ClientNetns, hostPort(node.IP, nodePort)),
	}
	for _, f := range flows { // each flow has its un-NATed entry
		if _, ok := f.undelivered(t, time.Time{}); !ok {
			t.FailNow()
		}
	}
	s := udpService("udp-late", v1.ServiceTypeNodePort)
	s.Spec.ClusterIP = clusterIP
	s.Spec.Ports[0].NodePort = nodePort
	_, since := expose(t, c, s, []*netns.Pod{target})
	for _, f := range flows {
		followed(t, lat, "Service created -> "+f.name+" reaches it")(f.reaches(t, target, since))
	}
}

// The pod a flow runs to becomes terminating but still serving while
// another is ready: new flows go to the ready pod, and the running ones,
// through the cluster IP and a NodePort, stay on theirs until it stops
// serving, as in kube-proxy (a TCP connection would stay too); then they
// move.
func testUDPTerminatingServingKeepsFlow(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	node := c.Nodes[0]
	pod, old, ready := node.Pods[0], c.Nodes[1].Pods[0], c.Nodes[1].Pods[1]
	barrier := newCleanBarrier(t, c, "udp-barrier-drain", pod)
	svc, flows := establish(t, c, udpService("udp-drain", v1.ServiceTypeNodePort), old, []flowSpec{
		{"ClusterIP from a pod", pod.Netns, toClusterIP},
		{"NodePort from the client", c.ClientNetns, toNodePort(node)},
	}, nil)
	vip, np := toClusterIP(svc), toNodePort(node)(svc)
	if err := c.SetEndpoints(ctx, svc, netns.Ready(old, ready)); err != nil {
		t.Fatal(err)
	}
	if _, err := netns.WaitBackends(ctx, pod.Netns, "udp", vip, []*netns.Pod{old, ready}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := c.SetEndpoints(ctx, svc, []netns.Endpoint{{Pod: old, Terminating: true, Serving: true}, {Pod: ready}}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	waitOnly(ctx, t, pod.Netns, vip, ready, changed)
	waitOnly(ctx, t, c.ClientNetns, np, ready, changed)
	passed := barrier.pass(t)
	for _, f := range flows {
		f.stays(t, old, changed, passed)
	}
	// It stops serving: new flows went to the ready pod already, so only
	// what serves changes, and the running flows move.
	moveFlows(t, c, lat, svc, []netns.Endpoint{{Pod: old, Terminating: true}, {Pod: ready}}, flows, ready,
		"endpoint stops serving -> %s on the ready pod")
}

// A flow from a pod runs, under internalTrafficPolicy Local, to the only
// endpoint on its node, which becomes terminating but still serving while
// a pod on the other node is ready; then the policy flips to Cluster: new
// flows go to the ready pod, and the running one stays on its pod, as in
// kube-proxy, which keeps a flow to any serving endpoint whatever the
// traffic policies.
func testUDPInternalPolicyFlipKeepsFlow(t *testing.T, c *netns.Cluster, lat *latencies) {
	ctx := ctxFor(t)
	node := c.Nodes[0]
	pod, local, ready := node.Pods[0], node.Pods[1], c.Nodes[1].Pods[0]
	barrier := newCleanBarrier(t, c, "udp-barrier-itp", pod)
	s := udpService("udp-itp", v1.ServiceTypeClusterIP)
	s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	svc, flows := establish(t, c, s, local, []flowSpec{{"ClusterIP from a pod", pod.Netns, toClusterIP}}, nil)
	vip := toClusterIP(svc)
	if err := c.SetEndpoints(ctx, svc, []netns.Endpoint{{Pod: local, Terminating: true, Serving: true}, {Pod: ready}}); err != nil {
		t.Fatal(err)
	}
	cur, err := c.Client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyCluster)
	if _, err := c.Client.CoreV1().Services(svc.Namespace).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	waitOnly(ctx, t, pod.Netns, vip, ready, changed)
	passed := barrier.pass(t)
	for _, f := range flows {
		f.stays(t, local, changed, passed)
	}
}

// waitOnly waits until fresh UDP requests from namespace from to addr are
// answered by pod alone: the agent there has applied a change.
func waitOnly(ctx context.Context, t *testing.T, from, addr string, pod *netns.Pod, since time.Time) {
	t.Helper()
	if _, err := netns.WaitBackends(ctx, from, "udp", addr, []*netns.Pod{pod}, since); err != nil {
		t.Fatal(err)
	}
}

// stays wants the flow answered by pod alone since since (a datagram lost
// on the way does not count against it), and steadily after passed.
func (f *udpFlow) stays(t *testing.T, pod *netns.Pod, since, passed time.Time) {
	t.Helper()
	if _, ok := f.waitStreak(t, "stay on "+pod.Name, passed, 5, func(o flowOutcome) bool { return o.pod == pod.Name }); !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range f.outs {
		if !o.at.Before(since) && (o.refused || o.pod != "" && o.pod != pod.Name) {
			t.Errorf("flow %s left %s: outcomes since the change: %s", f.name, pod.Name, f.summaryLocked(since))
			return
		}
	}
}

// cleanBarrier shows that a node's agent has walked its conntrack table
// since a moment. A flow from a pod of the node runs to a Service of two
// endpoints; pass takes away the endpoint it runs to and waits until the
// flow reaches the other one, which only a walk of the table begun after
// that change makes it do. Every change the agent applied before is
// cleaned by then: a walk cleans all the changes applied since the last.
type cleanBarrier struct {
	c      *netns.Cluster
	svc    *v1.Service
	flow   *udpFlow
	remain *netns.Pod
}

func newCleanBarrier(t *testing.T, c *netns.Cluster, name string, from *netns.Pod) *cleanBarrier {
	t.Helper()
	ctx := ctxFor(t)
	var eps []*netns.Pod
	for _, n := range c.Nodes[:2] {
		if p := n.Pods[len(n.Pods)-1]; p != from {
			eps = append(eps, p)
		}
	}
	svc, since := expose(t, c, udpService(name, v1.ServiceTypeClusterIP), eps)
	vip := toClusterIP(svc)
	if _, err := netns.WaitBackends(ctx, from.Netns, "udp", vip, eps, since); err != nil {
		t.Fatal(err)
	}
	f := startServedUDPFlow(t, "to "+name, from.Netns, vip)
	gone := f.answeredBy(t, c, since)
	remain := eps[0]
	if remain == gone {
		remain = eps[1]
	}
	return &cleanBarrier{c: c, svc: svc, flow: f, remain: remain}
}

// pass returns once the agent has walked its table after now, and when.
func (b *cleanBarrier) pass(t *testing.T) time.Time {
	t.Helper()
	if err := b.c.SetEndpoints(ctxFor(t), b.svc, netns.Ready(b.remain)); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.flow.reaches(t, b.remain, time.Now()); !ok {
		t.FailNow()
	}
	return time.Now()
}
