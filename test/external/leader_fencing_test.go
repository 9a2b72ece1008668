package external

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/test/cluster"
)

// The test binary doubles as an `agent controller` process: started with
// OHX_CONTROLLER set (startController) it runs the controller's hook, in
// the network namespace it was started in, until SIGTERM.
func init() {
	if cfg := os.Getenv("OHX_CONTROLLER"); cfg != "" {
		os.Exit(controllerMain(cfg, os.Getenv("OHX_KUBECONFIG"), os.Getenv("OHX_IDENTITY")))
	}
}

// controllerMain runs external.NewController as `agent controller` does,
// as identity. Its requests carry identity as their user agent, so that
// the objects' managedFields and events name the controller that wrote
// them.
func controllerMain(cfgJSON, kubeconfig, identity string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("controller", identity)
	cfg, c, dyn, err := processSetup(cfgJSON, kubeconfig, identity)
	if err != nil {
		log.Error("setup", "err", err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	h, err := external.NewController(cfg, c, identity, log, external.WithDynamicClient(dyn))
	if err != nil {
		log.Error("controller", "err", err)
		return 2
	}
	if err := h.Run(ctx); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	log.Info("controller stopped")
	return 0
}

// startController runs a controller process (controllerMain) named name
// in namespace n of tp, with the identity of its pod under deploy/base's
// RBAC; it is killed at cleanup, and a refused request in its log fails
// the test.
func (s *split) startController(tp *topo, n, name string, cfg config.Config) *exec.Cmd {
	t := s.t
	t.Helper()
	id, err := s.cp.PodIdentity(context.Background(), cluster.AgentNamespace, cluster.ControllerServiceAccount, name, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := tp.command(n, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "OHX_CONTROLLER="+string(b), "OHX_KUBECONFIG="+id.Kubeconfig, "OHX_IDENTITY="+name)
	tp.startLogged(cmd, "controller "+name, func(log string) { checkNodeLog(t, name, log) })
	return cmd
}

// allocatorHolder is the allocator Lease's holder ("" for none).
func allocatorHolder(c kubernetes.Interface) string {
	l, err := c.CoordinationV1().Leases(splitLeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// waitHolder waits until the allocator Lease names holder.
func waitHolder(t *testing.T, c kubernetes.Interface, holder, what string) {
	t.Helper()
	if _, ok := waitFor(context.Background(), 60*time.Second, func() bool { return allocatorHolder(c) == holder }); !ok {
		t.Fatalf("%s: the allocator Lease is held by %q, want %s", what, allocatorHolder(c), holder)
	}
}

// eventsBy are the events of reason on the Service default/name that
// controller wrote.
func eventsBy(c kubernetes.Interface, name, reason, controller string) []string {
	evs, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range evs.Items {
		if e.Reason == reason && e.Source.Host == controller {
			out = append(out, fmt.Sprintf("%s at %s", e.Message, e.CreationTimestamp.UTC().Format(time.RFC3339)))
		}
	}
	return out
}

// TestLeaderFencedOnRenewDeadline: two controller processes, each in its
// own network namespace, under deploy/base's RBAC. The leader, a, is cut
// off from the apiserver (its packets to it dropped; the apiserver's
// still reach it, so it goes on hearing of changes). Past a's renew
// deadline a Service with a bad annotation is created: a must not answer
// it, b takes the Lease over and does. Once a reaches the apiserver again,
// and what it sent meanwhile has arrived, the API holds no event of a's on
// that Service, and b keeps the Lease.
func TestLeaderFencedOnRenewDeadline(t *testing.T) {
	needs(t, "nft")
	tp := newTopo(t)
	tp.add("sw", "cp", "ctla", "ctlb")
	tp.ip("sw", "link", "add", "br0", "type", "bridge")
	tp.ip("sw", "link", "set", "br0", "up")
	for n, addr := range map[string]string{"cp": "10.0.0.2", "ctla": "10.0.0.21", "ctlb": "10.0.0.22"} {
		tp.veth("sw", "v"+n, n, "eth0")
		tp.ip("sw", "link", "set", "v"+n, "master", "br0")
		tp.ip(n, "addr", "add", addr+"/24", "dev", "eth0")
	}
	cp, c := tp.startControlPlane("cp", "10.0.0.2")
	sp := newSplit(t, cp)
	lease := config.LeaseTiming{Duration: config.Duration{Duration: 6 * time.Second},
		RenewDeadline: config.Duration{Duration: 4 * time.Second}, RetryPeriod: config.Duration{Duration: 500 * time.Millisecond}}
	cfg := sp.config(config.Config{Pools: []config.PoolConfig{{Name: "main", Addresses: []string{"192.0.2.1-192.0.2.3"}}}, LeaderLease: lease})
	const a, b = "onehop-controller-a", "onehop-controller-b"
	holders := watchHolders(t, c)
	sp.startController(tp, "ctla", a, cfg)
	waitHolder(t, c, a, "the first controller")
	sp.startController(tp, "ctlb", b, cfg)
	createLB(t, c, "web", 80)
	lbIPs(t, c, "web", "allocation", some)

	// a's packets to the apiserver are dropped from now on.
	tp.exec("ctla", "nft", "add", "table", "inet", "ohxcut")
	tp.exec("ctla", "nft", "add", "chain", "inet", "ohxcut", "out", "{ type filter hook output priority 0 ; }")
	tp.exec("ctla", "nft", "add", "rule", "inet", "ohxcut", "out", "ip", "daddr", "10.0.0.2", "drop")
	time.Sleep(lease.RenewDeadline.Duration + time.Second) // past a's renew deadline
	createLB(t, c, "late", 81, annotate(alloc.AnnotationLoadBalancerIPs, "not-an-address"))
	waitHolder(t, c, b, "a cut off")
	if _, ok := waitFor(context.Background(), 30*time.Second, func() bool { return len(eventsBy(c, "late", "BadAnnotation", b)) > 0 }); !ok {
		t.Fatal("the new leader b put no BadAnnotation event on late")
	}

	// a reaches the apiserver again: what it sent meanwhile arrives, and
	// it hears that b leads. The broadcaster retries an event for a
	// while: one a recorded would have come by now.
	tp.exec("ctla", "nft", "delete", "table", "inet", "ohxcut")
	var late []string
	waitFor(context.Background(), 20*time.Second, func() bool {
		late = eventsBy(c, "late", "BadAnnotation", a)
		return len(late) > 0
	})
	if len(late) > 0 {
		t.Errorf("a wrote after its renew deadline, while b held the Lease: its events on late: %q", late)
	}
	if got := holders(); strings.Join(got, " ") != a+" "+b {
		t.Errorf("the allocator Lease's holders in turn: %q; want a, then b alone (a took or released it after it came back)", got)
	}
}

// watchHolders follows the allocator Lease of a split install until the
// test ends; the function it returns gives its holders so far in turn
// ("" for released), each change once.
func watchHolders(t *testing.T, c kubernetes.Interface) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.CoordinationV1().Leases(splitLeaseNamespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + leases.AllocatorLeaseName})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	go func() {
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			h := ""
			if l.Spec.HolderIdentity != nil {
				h = *l.Spec.HolderIdentity
			}
			mu.Lock()
			if len(seen) == 0 || seen[len(seen)-1] != h {
				seen = append(seen, h)
			}
			mu.Unlock()
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// TestLeaderWithoutWebhookGivesUpLease: controller a holds the allocator
// Lease (from before its restart: the Lease names it and would not expire
// for an hour), but its webhook secret is missing, so it cannot send what
// it allocates. It gives the Lease up: b, whose secret is there, leads,
// allocates and sends the Service's state to the receiver; a's health
// check says why a does not lead.
func TestLeaderWithoutWebhookGivesUpLease(t *testing.T) {
	ctx := t.Context()
	cp, _ := cluster.StartTest(t, "leadhook", "192.0.2.9")
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	createReadyNode(t, c, "n1", "10.0.0.11")
	sp := newSplit(t, cp)
	rcv, url, caFile := startTLSReceiver(t)
	cfg := sp.config(ipamConfig())
	missing := filepath.Join(t.TempDir(), "webhook-secret")
	cfgA, cfgB := cfg, cfg
	cfgA.Webhook = &webhook.Config{URL: url, CAFile: caFile, SecretFile: missing, MaxBackoffSeconds: 1}
	cfgB.Webhook = &webhook.Config{URL: url, CAFile: caFile, Secret: "s3cret", MaxBackoffSeconds: 1}

	const a, b = "onehop-controller-a", "onehop-controller-b"
	now := metav1.NewMicroTime(time.Now())
	if _, err := c.CoordinationV1().Leases(splitLeaseNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: splitLeaseNamespace, Name: leases.AllocatorLeaseName},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new(a), LeaseDurationSeconds: new(int32(3600)),
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ha, hb := sp.newController(cfgA, a, ""), sp.newController(cfgB, b, "")
	runUntilEnd(t, "controller "+a, ha)
	runUntilEnd(t, "controller "+b, hb)
	waitHolder(t, c, b, "a's webhook secret is missing")

	createLB(t, c, "web", 80)
	ips := lbIPs(t, c, "web", "allocation by b", some)
	setEndpoints(t, c, "web", map[string]string{"n1": "10.244.1.2"})
	if p := rcv.waitNodes(t, "default/web", "n1"); strings.Join(p.IPs, ",") != strings.Join(ips, ",") {
		t.Fatalf("payload %+v; want ips %v", p, ips)
	}
	if err := ha.Healthy(); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("a's health: %v; want the missing secret named", err)
	}
	if err := hb.Healthy(); err != nil {
		t.Errorf("b's health: %v", err)
	}
	if h := allocatorHolder(c); h != b {
		t.Errorf("the allocator Lease went back to %q", h)
	}
}
