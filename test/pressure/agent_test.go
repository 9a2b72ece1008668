package pressure

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
	"github.com/onehop/onehop/test/procstat"
)

// agent is one agent process under test.
type agent struct {
	node *netns.Node
	proc *nsutil.Process
}

// agentVia replaces node n's agent with one that reaches the API server
// only through p: its kubeconfig is the node's (the same identity) with
// the proxy's address and CA. The first agent is SIGKILLed, leaving its
// rules, as in a crash; the new one takes them over with its first sync.
// It is stopped when t ends, before the cluster goes.
func agentVia(t *testing.T, c *netns.Cluster, n *netns.Node, p *apiProxy) *agent {
	t.Helper()
	args := c.AgentArgs(n)
	i := slices.Index(args, "--kubeconfig")
	if i < 0 || i+1 == len(args) {
		t.Fatalf("no --kubeconfig in the agent's arguments %q", args)
	}
	kc, err := clientcmd.LoadFromFile(args[i+1])
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		cl.Server, cl.CertificateAuthority, cl.CertificateAuthorityData = p.URL(), "", p.caPEM
	}
	args[i+1] = filepath.Join(c.Dir, n.Name+"-via-proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, args[i+1]); err != nil {
		t.Fatal(err)
	}
	c.KillAgent(n)
	log := filepath.Join(c.Dir, "agent-"+n.Name+"-via-proxy.log")
	proc, err := nsutil.Start(n.Netns, "agent "+n.Name+" via proxy", log, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{node: n, proc: proc}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("=== %s agent (via the proxy) log, tail:\n%s", n.Name, proc.Tail(8000))
		}
		proc.Stop(3 * time.Second)
	})
	a.waitFirstSync(t)
	return a
}

// proxied is a cluster whose node 1 agent reaches the API server through
// a proxy, with a client pod on node 1 and the other pods as backends.
type proxied struct {
	c        *netns.Cluster
	proxy    *apiProxy
	agent    *agent
	client   *netns.Pod
	backends []*netns.Pod
}

func newProxied(t *testing.T) *proxied {
	t.Helper()
	c := newCluster(t, netns.Config{})
	n := c.Nodes[0]
	p := startAPIProxy(t, c, n)
	return &proxied{c: c, proxy: p, agent: agentVia(t, c, n, p), client: n.Pods[0], backends: others(c, n.Pods[0])}
}

// clusterAgent is node n's agent as the cluster started it.
func clusterAgent(n *netns.Node) *agent { return &agent{node: n, proc: n.Agent()} }

func (a *agent) httpClient() *http.Client {
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{DialContext: nsutil.Dialer(a.node.Netns), DisableKeepAlives: true},
	}
}

// alive fails when the agent has exited.
func (a *agent) alive() error {
	if done, err := a.proc.Exited(); done {
		return fmt.Errorf("agent on %s exited (%v); log %s:\n%s", a.node.Name, err, a.proc.Log, a.proc.Tail(4000))
	}
	return nil
}

// scrape reads the agent's /metrics: each sample by its series, e.g.
// `onehop_syncs_total{mode="full"}`.
func (a *agent) scrape() (map[string]float64, error) {
	return procstat.Scrape(context.Background(), a.httpClient(), fmt.Sprintf("http://127.0.0.1:%d/metrics", netns.MetricsPort))
}

// metrics is scrape for t: an error fails it.
func (a *agent) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	m, err := a.scrape()
	if err != nil {
		t.Fatalf("metrics of %s's agent: %v", a.node.Name, err)
	}
	return m
}

// waitFirstSync waits until the agent has programmed its first full
// ruleset, as its metrics count it.
func (a *agent) waitFirstSync(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(netns.ConvergeTimeout)
	for {
		if err := a.alive(); err != nil {
			t.Fatal(err)
		}
		m, err := a.scrape()
		if err == nil && fullSyncs(m) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's agent made no full sync within %v (metrics: %v); log:\n%s", a.node.Name, netns.ConvergeTimeout, err, a.proc.Tail(4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// syncCounters are the agent's counts of its dataplane syncs.
var syncCounters = []string{
	`onehop_syncs_total{mode="full"}`,
	`onehop_syncs_total{mode="partial"}`,
	`onehop_sync_failures_total{mode="full"}`,
	`onehop_sync_failures_total{mode="partial"}`,
	`onehop_sync_changed_portals_total`,
	`onehop_sync_messages_total`,
	`kubeproxy_sync_full_proxy_rules_duration_seconds_count`,
	`kubeproxy_sync_partial_proxy_rules_duration_seconds_count`,
}

// syncDelta says how each sync counter moved from before to after.
func syncDelta(before, after map[string]float64) string {
	var b strings.Builder
	for _, k := range syncCounters {
		fmt.Fprintf(&b, "  %-60s %6g -> %6g\n", k, before[k], after[k])
	}
	return b.String()
}

// fullSyncs is how many times the agent rewrote its whole ruleset.
func fullSyncs(m map[string]float64) float64 { return m[`onehop_syncs_total{mode="full"}`] }

// onlyChangesSynced checks that the agent is still running and, since
// its metrics read before, synced what changed after the event without
// rewriting its whole ruleset.
func (a *agent) onlyChangesSynced(t *testing.T, before map[string]float64, event string) {
	t.Helper()
	if err := a.alive(); err != nil {
		t.Fatal(err)
	}
	after := a.metrics(t)
	t.Logf("sync counters before %s -> after convergence:\n%s", event, syncDelta(before, after))
	if fullSyncs(after) != fullSyncs(before) {
		t.Errorf("the agent rewrote its whole ruleset %g time(s) after %s; want only the changes synced",
			fullSyncs(after)-fullSyncs(before), event)
	}
}

// cpuTime is the CPU time the agent has used so far (user and system,
// from /proc/PID/stat).
func (a *agent) cpuTime(t *testing.T) time.Duration {
	t.Helper()
	secs, err := procstat.CPUSeconds(a.proc.Pid())
	if err != nil {
		t.Fatalf("agent of %s: %v", a.node.Name, err)
	}
	return time.Duration(secs * float64(time.Second))
}

// logSize is the length of the agent's log so far, for logSince.
func (a *agent) logSize(t *testing.T) int64 {
	t.Helper()
	st, err := os.Stat(a.proc.Log)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// logSince returns the lines the agent logged after offset.
func (a *agent) logSince(t *testing.T, offset int64) []string {
	t.Helper()
	f, err := os.Open(a.proc.Log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}
