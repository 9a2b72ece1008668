package external

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// hookMain runs a whole external.Hook as an agent would, in a node's
// namespace, until SIGTERM. It stands in for the dataplane by reporting the
// VIP as programmed with local endpoints (the nft rule of the lab does the
// DNAT), so which nodes announce is decided by the cluster state alone.
// With OHX_MODEL set it reports instead what the agent's own model (package
// portal, fed by informers, with externalIPCIDRs as --external-ip-cidrs)
// would have the dataplane program, wired as cmd/agent wires it. With
// OHX_METRICS set it serves the hook's metrics on that Unix socket.
func hookMain(cfgJSON, kubeconfig, node string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg, c, dyn, err := processSetup(cfgJSON, kubeconfig, "")
	if err != nil {
		log.Error("setup", "err", err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	opts := []external.Option{external.WithDynamicClient(dyn)}
	if sock := os.Getenv("OHX_METRICS"); sock != "" {
		// The agent's metrics, served on a Unix socket the test (in
		// another network namespace) can reach.
		reg := prometheus.NewRegistry()
		m := dataplane.NewMetrics(reg)
		_ = os.Remove(sock) // an earlier agent's of this node
		ln, err := net.Listen("unix", sock)
		if err != nil {
			log.Error("metrics", "err", err)
			return 2
		}
		go func() { _ = m.ServeListener(ctx, ln, reg, false) }()
		opts = append(opts, external.WithProviderHealth(nil, m), external.WithRegisterer(reg))
	}
	h, watch, err := newAgentHook(cfg, c, node, log, opts...)
	if err != nil {
		log.Error("hook", "err", err)
		return 2
	}
	if os.Getenv("OHX_MODEL") != "" {
		if err := followModel(ctx, h, c, cfg, node, watch); err != nil {
			log.Error("model", "err", err)
			return 2
		}
	} else {
		key := portal.ServiceKey{Namespace: "default", Name: "web"}
		ep := netip.MustParseAddrPort("10.244.0.2:8080")
		h.Programmed(&portal.Snapshot{Services: map[portal.ServiceKey]*portal.Service{key: {Key: key, Portals: []*portal.Portal{{
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr(vip)}, ClusterEndpoints: []netip.AddrPort{ep}, LocalEndpoints: []netip.AddrPort{ep}}}}}})
	}
	if err := h.Run(ctx); err != nil {
		log.Error("run", "err", err)
		return 1
	}
	log.Info("hook stopped")
	return 0
}

// processSetup is what a process a test starts (hookMain, controllerMain)
// runs on: its configuration (JSON) and its clients from kubeconfig, with
// userAgent as their user agent unless empty (the default client-go's).
func processSetup(cfgJSON, kubeconfig, userAgent string) (config.Config, kubernetes.Interface, dynamic.Interface, error) {
	var cfg config.Config
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		return cfg, nil, nil, fmt.Errorf("config: %w", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return cfg, nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if userAgent != "" {
		rc.UserAgent = userAgent
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return cfg, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(rc) // the onehop.io custom resources, with crds
	return cfg, c, dyn, err
}

// TestBGPHookLocalPolicy: the control plane sits on the nodes' segment;
// the hook runs as deploy/ ships it: an `agent controller` allocates the
// VIP from a pool and writes the Service's status under its own RBAC, and
// one node agent (the bgp provider, SeparateController) per node announces
// under the node agents' RBAC and admission policy; a refused request fails
// the test. The Local-policy Service gets the VIP; the router's ECMP next
// hops are exactly the nodes with a ready endpoint; deleting node2's
// endpoint withdraws node2 (time logged; the issue asks for < 1 s), and
// the controller puts an IPMoved event on the Service naming the next hops
// before and after; an agent stopping withdraws.
func TestBGPHookLocalPolicy(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")

	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{
		Pools: []config.PoolConfig{{Name: "lab", Addresses: []string{vip}}},
		BGP:   &bgp.Config{ASN: 64513, Peers: []bgp.Peer{{Address: "10.0.0.1", ASN: 64512, HoldTimeSeconds: 9}}},
	})
	sp.runController(cfg, "onehop-controller-0", "")
	agents := map[string]*exec.Cmd{}
	for _, n := range []string{"node1", "node2"} {
		agents[n] = sp.startNodeAgent(lab.topo, n, cfg)
	}

	createLB(t, c, "web", 80, func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	checkAllocatorHolder(t, c, "onehop-controller-0")
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	lab.waitHops(t, "both nodes have a local endpoint", "10.0.0.11", "10.0.0.12")
	if got, err := lab.get("client", vip+":80"); err != nil || !strings.HasPrefix(got, "pod") {
		t.Fatalf("client -> %s: %q, %v", vip, got, err)
	}

	t0 := time.Now()
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2"})
	d := lab.waitHops(t, "node2's last local endpoint deleted", "10.0.0.11")
	t.Logf("Local policy: node2 withdrawn from the router's FIB %v after its last endpoint was deleted (issue target < 1 s; within: %v)",
		d.Round(time.Millisecond), time.Since(t0) < time.Second)
	// The controller says so on the Service.
	eventSaying(t, c, "default", "web", "IPMoved", vip+": BGP next hops now node1, were node1, node2")

	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	lab.waitHops(t, "node2 back", "10.0.0.11", "10.0.0.12")
	eventSaying(t, c, "default", "web", "IPMoved", vip+": BGP next hops now node1, node2, were node1")
	t0 = time.Now()
	_ = agents["node2"].Process.Signal(syscall.SIGTERM)
	lab.waitHops(t, "node2's agent stops", "10.0.0.11")
	t.Logf("agent stop: node2 withdrawn %v after SIGTERM", time.Since(t0).Round(time.Millisecond))
	if err := agents["node2"].Wait(); err != nil {
		t.Errorf("agent node2 exit: %v", err)
	}
}

// setEndpoints makes the Service's endpoints exactly one ready endpoint per
// node given (node -> pod IP).
func setEndpoints(t *testing.T, c kubernetes.Interface, svc string, eps map[string]string) {
	t.Helper()
	putSlice(t, c, svc, svc+"-1", discoveryv1.AddressTypeIPv4, eps)
}

// putSlice creates or replaces the Service's EndpointSlice name, of one
// address type, with one ready endpoint per node given (node -> pod IP).
func putSlice(t *testing.T, c kubernetes.Interface, svc, name string, family discoveryv1.AddressType, eps map[string]string) {
	t.Helper()
	ctx := context.Background()
	ready := true
	port, proto, portName := int32(8080), corev1.ProtocolTCP, ""
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
	for node, ip := range eps {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: new(node), Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	old, err := c.DiscoveryV1().EndpointSlices("default").Get(ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = c.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = c.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(fmt.Errorf("endpoint slice: %w", err))
	}
}

// startAgent runs a Hook (hookMain) for node n inside its namespace; it is
// killed at cleanup, its log shown when the test failed.
func (tp *topo) startAgent(n string, cfg config.Config, kubeconfig string) *exec.Cmd {
	t := tp.t
	t.Helper()
	b, _ := json.Marshal(cfg)
	cmd := tp.command(n, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "OHX_HOOK="+string(b), "OHX_KUBECONFIG="+kubeconfig, "OHX_NODE="+n)
	tp.startLogged(cmd, "agent "+n)
	return cmd
}
