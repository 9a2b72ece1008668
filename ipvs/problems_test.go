package ipvs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// missingScheduler returns a scheduler onehop accepts by name that the
// test kernel cannot load (the VM carries only some ip_vs_* modules), asked
// with ipvsadm in the node namespace.
func (n *testNet) missingScheduler() string {
	n.t.Helper()
	for _, s := range []string{"twos", "ovf", "fo", "nq", "sed", "lblcr"} {
		if _, err := nsutil.Exec(context.Background(), n.node, "ipvsadm", "-A", "-f", "7001", "-s", s); err != nil {
			return s
		}
		_, _ = nsutil.Exec(context.Background(), n.node, "ipvsadm", "-D", "-f", "7001")
	}
	n.t.Skip("this kernel has every IPVS scheduler: none to refuse")
	return ""
}

// TestOneSchedulerRefusedHundredServed: 100 Services with valid scheduler
// annotations and one asking for a scheduler the node's kernel lacks, given
// to the agent as Kubernetes objects. The 100 are served; the one gets one
// event saying so and is served with the default scheduler; the node's
// syncs go on (a later change is programmed).
func TestOneSchedulerRefusedHundredServed(t *testing.T) {
	n := newTestNet(t, 2)
	missing := n.missingScheduler()
	valid := []string{"rr", "wrr", "lc", "wlc", "sh", "mh"}
	var objs []any
	for i := range 100 {
		name := fmt.Sprintf("svc-%03d", i)
		objs = append(objs, service(name, nthIP("10.96.1.0", i+1), func(s *v1.Service) {
			s.Annotations = map[string]string{portal.AnnotationScheduler: valid[i%len(valid)]}
		}), slice(name, 1, 2))
	}
	const hostileIP = "10.96.2.1"
	objs = append(objs, service("hostile", hostileIP, func(s *v1.Service) {
		s.Annotations = map[string]string{portal.AnnotationScheduler: missing}
	}), slice("hostile", 1, 2))
	a := n.startAgent(objs...)
	a.waitSynced()

	failed := 0
	for i := range 100 {
		addr := nthIP("10.96.1.0", i+1) + ":80"
		c, err := n.dial(n.client, addr)
		if err != nil {
			if failed++; failed <= 5 {
				t.Errorf("svc-%03d (%s): %v", i, addr, err)
			}
			continue
		}
		c.Close()
	}
	t.Logf("100 Services with valid schedulers: %d failed", failed)
	if failed > 0 {
		t.Errorf("%d of the 100 Services did not answer", failed)
	}
	if pod, _ := n.get(t, n.client, hostileIP+":80"); pod == "" {
		t.Errorf("the Service asking for %s is not served", missing)
	}
	if d := a.b.dump(); !strings.Contains(d.Raw, "TCP "+hostileIP+":80 rr ") {
		t.Errorf("the Service asking for %s should have the default rr:\n%s", missing, d.Raw)
	}

	// Another sync: the event is not repeated, and a change is programmed.
	a.apply(slice("svc-000", 2))
	a.waitSynced()
	if pod, _ := n.get(t, n.client, nthIP("10.96.1.0", 1)+":80"); pod != "pod-2" {
		t.Errorf("after the change, svc-000 reached %s, want pod-2 only", pod)
	}
	var got []portal.Problem
	for _, e := range a.eventList() {
		t.Logf("event: %s", e)
		if e.Service.Name == "hostile" && e.Reason == portal.ReasonInvalidScheduler {
			got = append(got, e)
		} else {
			t.Errorf("unexpected event %s", e)
		}
	}
	if len(got) != 1 || !strings.Contains(got[0].Message, missing) {
		t.Errorf("want one %s event on test/hostile naming %q, got %v", portal.ReasonInvalidScheduler, missing, got)
	}
}

// TestAdoptKubeProxyVirtualServers follows docs/migration.md from
// kube-proxy's IPVS mode: kube-proxy's virtual servers (a cluster IP on its
// kube-ipvs0 dummy, and a NodePort on the node's address, which onehop's
// state file does not name) are there and serving when the agent starts,
// with the scheduler both are configured with. The agent adopts them and a
// client requesting both all along sees no failed request; a later
// endpoint change reaches them. A third, with another scheduler than the
// Service asks for, is updated to the Service's. A fourth, of a Service
// that is gone, is left alone and logged.
func TestAdoptKubeProxyVirtualServers(t *testing.T) {
	n := newTestNet(t, 2)
	const cip, other, gone = "10.96.3.10", "10.96.3.11", "10.96.3.12"
	ctx := context.Background()
	for _, c := range [][]string{
		// kube-proxy's IPVS mode keeps conntrack entries for IPVS and
		// masquerades what comes from outside the cluster network.
		{"sysctl", "-w", "net.ipv4.vs.conntrack=1"},
		{"iptables", "-t", "nat", "-A", "POSTROUTING", "-m", "ipvs", "--ipvs", "--vdir", "ORIGINAL", "!", "-s", "10.244.0.0/16", "-j", "MASQUERADE"},
		{"ip", "link", "add", "kube-ipvs0", "type", "dummy"},
		{"ip", "addr", "add", cip + "/32", "dev", "kube-ipvs0"},
		{"ip", "addr", "add", other + "/32", "dev", "kube-ipvs0"},
		{"ipvsadm", "-A", "-t", cip + ":80", "-s", "rr"},
		{"ipvsadm", "-a", "-t", cip + ":80", "-r", podIP(1) + ":8080", "-m"},
		{"ipvsadm", "-a", "-t", cip + ":80", "-r", podIP(2) + ":8080", "-m"},
		{"ipvsadm", "-A", "-t", nodeIP + ":30090", "-s", "rr"},
		{"ipvsadm", "-a", "-t", nodeIP + ":30090", "-r", podIP(1) + ":8080", "-m"},
		{"ipvsadm", "-a", "-t", nodeIP + ":30090", "-r", podIP(2) + ":8080", "-m"},
		{"ipvsadm", "-A", "-t", other + ":80", "-s", "sh"},
		{"ipvsadm", "-a", "-t", other + ":80", "-r", podIP(1) + ":8080", "-m"},
		{"ipvsadm", "-A", "-t", gone + ":80", "-s", "sh"},
		{"ipvsadm", "-a", "-t", gone + ":80", "-r", podIP(1) + ":8080", "-m"},
	} {
		if out, err := nsutil.Exec(ctx, n.node, c...); err != nil {
			t.Fatalf("kube-proxy's state: %v: %v\n%s", c, err, out)
		}
	}

	// A client requesting both ways in, one new connection at a time.
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			addr := cip + ":80"
			if i%2 == 1 {
				addr = nodeIP + ":30090"
			}
			c, err := n.dial(n.client, addr)
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("%s: %v", addr, err))
				continue
			}
			c.Close()
			ok.Add(1)
		}
	}()
	stopped := false
	stopClient := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopClient()
	waitCount := func(what string, want int64) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ok.Load() < want; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d requests answered, %d failed (%v)", what, ok.Load(), failed.Load(), firstErr.Load())
			}
		}
	}
	waitCount("through kube-proxy's virtual servers", 4)

	a := n.startAgent(service("web", cip, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30090
	}), slice("web", 1, 2), service("other", other, nil), slice("other", 1, 2))
	a.waitSynced()
	waitCount("after the agent's sync", ok.Load()+20)
	stopClient()
	t.Logf("requests: %d answered, %d failed", ok.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d requests failed during the migration (first: %v)", failed.Load(), firstErr.Load())
	}
	d := a.b.dump()
	if !strings.Contains(d.Raw, "TCP "+other+":80 rr ") || !strings.Contains(d.Raw, podIP(2)+":8080") {
		t.Errorf("%s not updated to the Service's scheduler rr and endpoints:\n%s", other, d.Raw)
	}

	// The adopted virtual servers are the agent's: an endpoint change reaches them.
	a.apply(slice("web", 2))
	a.waitSynced()
	for _, addr := range []string{cip + ":80", nodeIP + ":30090"} {
		for range 2 {
			if pod, _ := n.get(t, n.client, addr); pod != "pod-2" {
				t.Errorf("%s after the endpoint change: %s, want pod-2", addr, pod)
			}
		}
	}
	if out, err := nsutil.Exec(ctx, n.node, "ipvsadm", "-Ln", "-t", gone+":80"); err != nil || !strings.Contains(out, "sh") || !strings.Contains(out, podIP(1)+":8080") {
		t.Errorf("the gone Service's virtual server was changed: %v\n%s", err, out)
	}
	if l := a.logged(); !strings.Contains(l, "left alone") || !strings.Contains(l, gone+":80") {
		t.Errorf("the gone Service's virtual server is not named in the log:\n%s", l)
	}
	for _, e := range a.eventList() {
		t.Errorf("unexpected event %s", e)
	}
}
