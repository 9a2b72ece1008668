package netns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/nsutil"
)

// Config shapes a cluster. The zero value is two nodes with two pods each.
type Config struct {
	Nodes       int // default 2
	PodsPerNode int // default 2
	// PodPrefix starts every pod name: "<prefix>-<node>-<i>"; default "echo".
	PodPrefix string
	// Agent is the agent binary; default $ONEHOP_AGENT or `go build
	// ./cmd/agent` into Dir.
	Agent string
	// AgentArgs are appended to every agent's `run` flags.
	AgentArgs []string
	// NoServiceCIDRFlag runs the agents without --service-cidr, as
	// deploy/base does: the ranges then come from the API server's
	// ServiceCIDR objects only.
	NoServiceCIDRFlag bool
	// AdminAgents runs the agents with the admin kubeconfig. By default
	// each agent has the identity deploy/ gives it: the node agents'
	// service account, with a token bound to a pod on its node, under
	// deploy/base's RBAC and admission policy; NewForTest fails the test
	// when an agent was refused a request.
	AdminAgents bool
	// ControlPlaneBin holds kube-apiserver and etcd; default
	// cluster.Binaries (hack/controlplane.sh).
	ControlPlaneBin string
	// Dir keeps logs and kubeconfigs; default a temp dir removed by Close
	// unless KeepDir.
	Dir     string
	KeepDir bool
	Log     *slog.Logger
}

// Cluster is a running namespace cluster.
type Cluster struct {
	ID     string // run prefix of every namespace name
	Dir    string
	CP     *cluster.ControlPlane
	Client kubernetes.Interface

	Router      string // router namespace
	ClientNetns string // external client namespace
	ControlNS   string // control-plane namespace
	Nodes       []*Node

	cfg      Config
	log      *slog.Logger
	agentBin string

	mu         sync.Mutex
	namespaces []string
	servers    []*nsutil.EchoServer
	closed     bool
	stopSignal func()
}

// Node is one node namespace.
type Node struct {
	Index    int    // 1-based
	Name     string // Kubernetes node name, e.g. "node-1"
	Netns    string
	IP       string // IPv4 InternalIP on the node segment
	IP6      string // IPv6 InternalIP on the node segment
	PodCIDR  string
	PodCIDR6 string
	Zone     string
	Pods     []*Pod

	agent     *nsutil.Process
	agentLogs int
	// kubeconfig is the agent's identity (AdminAgents: the admin's).
	kubeconfig string
}

// Pod is one pod namespace with its echo server.
type Pod struct {
	Name  string
	Netns string
	IP    string
	IP6   string
	Node  *Node
	Echo  *nsutil.EchoServer
}

// New builds the cluster: namespaces, links, control plane, Node objects,
// pods with echo servers, and one agent per node (waiting for each agent's
// healthz). On error everything already made is torn down.
func New(ctx context.Context, cfg Config) (c *Cluster, err error) {
	if err := nsutil.Available(); err != nil {
		return nil, err
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 2
	}
	if cfg.PodsPerNode == 0 {
		cfg.PodsPerNode = 2
	}
	if cfg.PodPrefix == "" {
		cfg.PodPrefix = "echo"
	}
	if cfg.Nodes > 200 || cfg.PodsPerNode > 200 {
		return nil, errors.New("at most 200 nodes and 200 pods per node")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	nsutil.Sweep(ctx, cfg.Log)

	c = &Cluster{ID: nsutil.RunID(), cfg: cfg, log: cfg.Log, Dir: cfg.Dir}
	if c.Dir == "" {
		sweepDirs(cfg.Log)
		if c.Dir, err = os.MkdirTemp("", dirPrefix+c.ID+"-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	c.stopSignal = c.closeOnSignal()
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()

	began := time.Now()
	binDir := cfg.ControlPlaneBin
	if binDir == "" {
		if binDir, err = cluster.Binaries(ctx); err != nil {
			return c, err
		}
	}
	if c.agentBin, err = agentBinary(ctx, cfg.Agent, c.Dir); err != nil {
		return c, err
	}
	if err := c.buildTopology(ctx); err != nil {
		return c, fmt.Errorf("topology: %w", err)
	}
	c.log.Info("namespaces up", "id", c.ID, "took", time.Since(began).Round(time.Millisecond))

	c.CP, err = cluster.Start(ctx, cluster.Options{
		Netns:   c.ControlNS,
		Address: ControlPlaneIP().String(),
		Port:    APIServerPort,
		BinDir:  binDir,
		Dir:     c.Dir + "/controlplane",
		Log:     c.log,
	})
	if err != nil {
		return c, err
	}
	if c.Client, err = c.CP.Client(); err != nil {
		return c, err
	}
	if err := c.registerNodes(ctx); err != nil {
		return c, err
	}
	if err := c.agentIdentities(ctx); err != nil {
		return c, err
	}
	if err := c.startPods(); err != nil {
		return c, err
	}
	for _, n := range c.Nodes {
		if err := c.StartAgent(ctx, n); err != nil {
			return c, err
		}
	}
	c.log.Info("cluster up", "id", c.ID, "nodes", len(c.Nodes), "took", time.Since(began).Round(time.Millisecond))
	return c, nil
}

func (c *Cluster) addNamespace(ctx context.Context, name string) error {
	c.mu.Lock()
	c.namespaces = append(c.namespaces, name)
	c.mu.Unlock()
	return nsutil.Create(ctx, name)
}

// Close stops every agent, echo server and control-plane process and deletes
// every namespace, in that order. It is safe to call more than once and from
// a signal handler.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if n.agent != nil {
			n.agent.Stop(3 * time.Second)
		}
	}
	for _, s := range c.servers {
		s.Close()
	}
	if c.CP != nil {
		c.CP.Stop()
	}
	for i := len(c.namespaces) - 1; i >= 0; i-- {
		if err := nsutil.Delete(ctx, c.namespaces[i]); err != nil {
			c.log.Warn("delete netns", "netns", c.namespaces[i], "err", err)
		}
	}
	if c.stopSignal != nil {
		c.stopSignal()
	}
	if c.cfg.Dir == "" && !c.cfg.KeepDir {
		_ = os.RemoveAll(c.Dir)
	}
	c.log.Info("cluster down", "id", c.ID)
}
