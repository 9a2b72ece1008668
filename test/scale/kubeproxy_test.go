package scale

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// EnvKubeProxy asks for kube-proxy (nftables mode, built from the
// Kubernetes module with the control plane) to run beside node 2's agent
// on the same objects, for comparison (ONEHOP_SCALE_KUBEPROXY=1).
const EnvKubeProxy = "ONEHOP_SCALE_KUBEPROXY"

// kubeProxyMetricsPort is where the comparison's kube-proxy serves its
// metrics inside node 2's namespace (the agent has the usual ports).
const kubeProxyMetricsPort = 20249

// kubeProxy is the comparison's kube-proxy process.
type kubeProxy struct {
	proc  *nsutil.Process
	node  *netns.Node
	c     *netns.Cluster
	start time.Time
}

// startKubeProxy runs kube-proxy in node's namespace, with the admin's
// identity and node's name, as a DaemonSet pod would; nil when the
// comparison is not asked for. Its tables (ip and ip6 kube-proxy) only
// touch Service addresses, which the test's traffic does not send to
// node 2.
func startKubeProxy(t *testing.T, c *netns.Cluster, node *netns.Node) *kubeProxy {
	t.Helper()
	if os.Getenv(EnvKubeProxy) == "" {
		return nil
	}
	bin := filepath.Join(os.Getenv("ONEHOP_CONTROLPLANE_BIN"), "kube-proxy")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: kube-proxy is built with the node set: ONEHOP_CONTROLPLANE_BIN=$(hack/controlplane.sh node): %v", EnvKubeProxy, err)
	}
	args := []string{bin,
		"--proxy-mode", "nftables",
		"--kubeconfig", c.CP.Kubeconfig,
		"--hostname-override", node.Name,
		"--cluster-cidr", netns.ClusterCIDR + "," + netns.ClusterCIDR6,
		"--healthz-bind-address", "127.0.0.1:20256",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", kubeProxyMetricsPort),
		// The namespace's conntrack limits are not kube-proxy's to set here.
		"--conntrack-max-per-core", "0", "--conntrack-min", "0",
		"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
		"--oom-score-adj", "0",
	}
	p, err := nsutil.Start(node.Netns, "kube-proxy "+node.Name, filepath.Join(c.Dir, "kube-proxy.log"), nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeProxy{proc: p, node: node, c: c, start: time.Now()}
	t.Cleanup(func() {
		p.Stop(5 * time.Second)
		// Its tables go with it: the agent's cleanup is onehop's only.
		_, _ = c.Nft(context.Background(), node, "delete", "table", "ip", "kube-proxy")
		_, _ = c.Nft(context.Background(), node, "delete", "table", "ip6", "kube-proxy")
	})
	return k
}

// programmed waits until kube-proxy's table holds clusterIP (it caught up
// with the last Service written) and returns how long it took from since;
// false after timeout.
func (k *kubeProxy) programmed(ctx context.Context, clusterIP string, since time.Time, timeout time.Duration) (time.Duration, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if done, _ := k.proc.Exited(); done {
			return 0, false
		}
		out, err := k.c.Nft(ctx, k.node, "list", "map", "ip", "kube-proxy", "service-ips")
		if err == nil && strings.Contains(out, clusterIP+" ") {
			return time.Since(since), true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return 0, false
}

// metrics reads kube-proxy's /metrics as name -> value.
func (k *kubeProxy) metrics(ctx context.Context) (map[string]float64, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: nsutil.Dialer(k.node.Netns), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", kubeProxyMetricsPort), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body), nil
}

// kubeProxyResults are the comparison's figures (zero when not measured).
type kubeProxyResults struct {
	ran          bool
	createCPU    float64
	converge     time.Duration
	caughtUp     bool
	mem          map[string]float64
	fullSync     float64 // mean of its full syncs, seconds
	fullSyncs    float64
	partialSync  float64 // mean of its partial syncs, seconds
	partialSyncs float64
}

// measure fills in what kube-proxy used while the objects were created
// (cpu0 at the start), once it caught up with the probe Service.
func (k *kubeProxy) measure(ctx context.Context, t *testing.T, cpu0 float64, clusterIP string, written time.Time) kubeProxyResults {
	t.Helper()
	r := kubeProxyResults{ran: true}
	r.converge, r.caughtUp = k.programmed(ctx, clusterIP, written, 20*time.Minute)
	if done, _ := k.proc.Exited(); done {
		t.Errorf("kube-proxy exited; log %s:\n%s", k.proc.Log, k.proc.Tail(3000))
		return r
	}
	r.createCPU = cpuSeconds(t, k.proc.Pid()) - cpu0
	// Settled as the agent is: settle after it caught up.
	if wait := settle - time.Since(written.Add(r.converge)); wait > 0 {
		time.Sleep(wait)
	}
	r.mem = memory(t, k.proc.Pid())
	if m, err := k.metrics(ctx); err == nil {
		if r.fullSyncs = m["kubeproxy_sync_full_proxy_rules_duration_seconds_count"]; r.fullSyncs > 0 {
			r.fullSync = m["kubeproxy_sync_full_proxy_rules_duration_seconds_sum"] / r.fullSyncs
		}
		if r.partialSyncs = m["kubeproxy_sync_partial_proxy_rules_duration_seconds_count"]; r.partialSyncs > 0 {
			r.partialSync = m["kubeproxy_sync_partial_proxy_rules_duration_seconds_sum"] / r.partialSyncs
		}
	} else {
		t.Logf("kube-proxy metrics: %v", err)
	}
	return r
}
