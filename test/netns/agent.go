package netns

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/nsutil"
)

// EnvAgent names the environment variable with a prebuilt agent binary.
const EnvAgent = "ONEHOP_AGENT"

// agentBinary returns path, $ONEHOP_AGENT, or a fresh `make build` into
// dir: the binary as shipped (its build tags, stripped), so that what the
// tests measure, its memory included, is what runs on a node.
func agentBinary(ctx context.Context, path, dir string) (string, error) {
	if path == "" {
		path = os.Getenv(EnvAgent)
	}
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("agent binary: %w", err)
		}
		return path, nil
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "agent")
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "build", "BIN="+out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make build: %v\n%s", err, b)
	}
	return out, nil
}

// AgentArgs returns the `agent run` command line for node n.
func (c *Cluster) AgentArgs(n *Node) []string {
	args := []string{
		c.agentBin, "run",
		"--kubeconfig", n.kubeconfig,
		"--hostname-override", n.Name,
		"--cluster-cidr", ClusterCIDR + "," + ClusterCIDR6,
		"--nodeport-addresses", NodeCIDR + "," + NodeCIDR6,
		"--external-ip-cidrs", ExternalCIDR + "," + ExternalCIDR6,
		"--healthz-bind-address", "0.0.0.0:" + strconv.Itoa(HealthzPort),
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(MetricsPort),
		"--min-sync-period", "0s",
	}
	if !c.cfg.NoServiceCIDRFlag {
		args = append(args, "--service-cidr", cluster.DefaultServiceCIDRs)
	}
	return append(args, c.cfg.AgentArgs...)
}

// StartAgent runs the agent inside node n's namespace and waits until its
// healthz answers 200.
func (c *Cluster) StartAgent(ctx context.Context, n *Node) error {
	n.agentLogs++
	logPath := filepath.Join(c.Dir, fmt.Sprintf("agent-%s.%d.log", n.Name, n.agentLogs))
	p, err := nsutil.Start(n.Netns, "agent "+n.Name, logPath, nil, c.AgentArgs(n)...)
	if err != nil {
		return err
	}
	n.agent = p
	began := time.Now()
	if err := c.waitAgentHealthy(ctx, n); err != nil {
		return err
	}
	c.log.Info("agent healthy", "node", n.Name, "took", time.Since(began).Round(time.Millisecond), "log", logPath)
	return nil
}

// KillAgent SIGKILLs node n's agent, leaving whatever it programmed in the
// kernel, as a crash would.
func (c *Cluster) KillAgent(n *Node) {
	if n.agent != nil {
		n.agent.Kill()
	}
}

// Agent returns node n's agent process (nil before StartAgent).
func (n *Node) Agent() *nsutil.Process { return n.agent }

func (c *Cluster) waitAgentHealthy(ctx context.Context, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	client := &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{DialContext: nsutil.Dialer(n.Netns), DisableKeepAlives: true},
	}
	url := fmt.Sprintf("http://%s:%d/healthz", n.IP, HealthzPort)
	var last string
	for {
		if done, err := n.agent.Exited(); done {
			return fmt.Errorf("agent on %s exited (%v); log %s:\n%s", n.Name, err, n.agent.Log, n.agent.Tail(4000))
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent on %s not healthy at %s: %s; log %s:\n%s", n.Name, url, last, n.agent.Log, n.agent.Tail(4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DumpRules runs `agent dump-rules -o format` inside node n's namespace.
func (c *Cluster) DumpRules(ctx context.Context, n *Node, format string) (string, error) {
	return nsutil.Exec(ctx, n.Netns, c.agentBin, "dump-rules", "-o", format)
}

// Nft runs `nft args...` inside node n's namespace (for debugging output).
func (c *Cluster) Nft(ctx context.Context, n *Node, args ...string) (string, error) {
	return nsutil.Exec(ctx, n.Netns, append([]string{"nft"}, args...)...)
}

// AgentLogTail returns the end of node n's current agent log.
func (c *Cluster) AgentLogTail(n *Node, bytes int) string {
	if n.agent == nil {
		return ""
	}
	return strings.TrimSpace(n.agent.Tail(bytes))
}

// agentIdentities gives each node's agent its kubeconfig: deploy/base's
// access-control objects are applied and each agent gets the token of a
// pod of the node agents' service account on its node, as the kubelet
// would give it; with AdminAgents, the admin kubeconfig.
func (c *Cluster) agentIdentities(ctx context.Context) error {
	if c.cfg.AdminAgents {
		for _, n := range c.Nodes {
			n.kubeconfig = c.CP.Kubeconfig
		}
		return nil
	}
	if err := c.CP.ApplyRBAC(ctx); err != nil {
		return fmt.Errorf("deploy/base RBAC: %w", err)
	}
	for _, n := range c.Nodes {
		id, err := c.CP.PodIdentity(ctx, cluster.AgentNamespace, cluster.NodeAgentServiceAccount, "onehop-"+n.Name, n.Name)
		if err != nil {
			return err
		}
		n.kubeconfig = id.Kubeconfig
	}
	return nil
}

// RefusedRequests returns the lines of every agent log so far (restarts
// included) that show a request the API server refused as forbidden.
func (c *Cluster) RefusedRequests() []string {
	var out []string
	for _, n := range c.Nodes {
		for i := 1; i <= n.agentLogs; i++ {
			b, err := os.ReadFile(filepath.Join(c.Dir, fmt.Sprintf("agent-%s.%d.log", n.Name, i)))
			if err != nil {
				continue
			}
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(strings.ToLower(l), "forbidden") {
					out = append(out, n.Name+": "+l)
				}
			}
		}
	}
	return out
}

// AgentPeakRSS returns the peak resident set size (VmHWM) of node n's
// running agent, in bytes.
func (c *Cluster) AgentPeakRSS(n *Node) (int64, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	want := strings.Join([]string{c.agentBin, "run", "--kubeconfig", n.kubeconfig, "--hostname-override", n.Name}, "\x00")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(b), want+"\x00") {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			return 0, err
		}
		for _, l := range strings.Split(string(st), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" && f[2] == "kB" {
				kb, err := strconv.ParseInt(f[1], 10, 64)
				return kb << 10, err
			}
		}
		return 0, fmt.Errorf("no VmHWM in /proc/%s/status", e.Name())
	}
	return 0, fmt.Errorf("no running agent of %s", n.Name)
}
