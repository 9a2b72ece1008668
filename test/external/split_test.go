package external

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/onehop/onehop/external"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/leases"
	"github.com/onehop/onehop/test/cluster"
)

// split is a cloud hook installed as deploy/ ships it: deploy/base's RBAC
// and admission policy applied, one `agent controller` and node agents
// each with the identity the kubelet would give its pod. Any request the
// RBAC refuses fails the test: the controller's are counted at its client,
// the node agents' found in their logs.
type split struct {
	t  *testing.T
	cp *cluster.ControlPlane
	// dir holds the node agents' metrics sockets (metricsSocket).
	dir string
}

// splitLeaseNamespace is where deploy/base keeps the hook's Leases.
const splitLeaseNamespace = "onehop-leases"

func newSplit(t *testing.T, cp *cluster.ControlPlane) *split {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cp.ApplyRBAC(ctx); err != nil {
		t.Fatal(err)
	}
	return &split{t: t, cp: cp, dir: t.TempDir()}
}

// config makes cfg the split's: node agents run only their part, the Leases
// live where the RBAC allows them.
func (s *split) config(cfg config.Config) config.Config {
	cfg.SeparateController = true
	cfg.LeaseNamespace = splitLeaseNamespace
	return cfg
}

// nodeKubeconfig is the kubeconfig of node's agent pod.
func (s *split) nodeKubeconfig(node string) string {
	s.t.Helper()
	id, err := s.cp.PodIdentity(context.Background(), cluster.AgentNamespace, cluster.NodeAgentServiceAccount, "onehop-"+node, node)
	if err != nil {
		s.t.Fatal(err)
	}
	return id.Kubeconfig
}

// runController runs `agent controller`'s hook in this process as the
// controller's pod name on node, until the test ends (or the returned stop).
// A 403 answer to any of its requests fails the test.
func (s *split) runController(cfg config.Config, name, node string) (stop func()) {
	s.t.Helper()
	return runUntilEnd(s.t, "controller "+name, s.newController(cfg, name, node))
}

// newController builds `agent controller`'s hook as runController runs it.
func (s *split) newController(cfg config.Config, name, node string) *external.Hook {
	t := s.t
	t.Helper()
	id, err := s.cp.PodIdentity(context.Background(), cluster.AgentNamespace, cluster.ControllerServiceAccount, name, node)
	if err != nil {
		t.Fatal(err)
	}
	failOnForbidden(t, "controller "+name, id.Config)
	c, err := kubernetes.NewForConfig(id.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(id.Config) // the onehop.io custom resources, with crds
	if err != nil {
		t.Fatal(err)
	}
	h, err := external.NewController(cfg, c, name, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})).With("controller", name),
		external.WithDynamicClient(dyn))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// failOnForbidden makes rc's client note every request answered 403, and
// fails t at its end if there was one (cleanups run last first: the check
// runs once what used the client stopped).
func failOnForbidden(t *testing.T, what string, rc *rest.Config) {
	var mu sync.Mutex
	var refused []string
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil && resp.StatusCode == http.StatusForbidden {
				mu.Lock()
				refused = append(refused, r.Method+" "+r.URL.String())
				mu.Unlock()
			}
			return resp, err
		})
	})
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if len(refused) > 0 {
			t.Errorf("%s was refused (403) %d requests under deploy/base's RBAC: %v", what, len(refused), refused)
		}
	})
}

// checkNodeLog fails the test when a node agent's log shows a request the
// RBAC or the admission policy refused.
func checkNodeLog(t *testing.T, node, log string) {
	t.Helper()
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(strings.ToLower(l), "forbidden") {
			t.Errorf("agent %s was refused a request under deploy/base's RBAC: %s", node, l)
		}
	}
}

// checkAllocatorHolder fails the test unless the allocator Lease of a split
// install is held by the controller named: the node agents, which run only
// their per-node part, never campaign for it.
func checkAllocatorHolder(t *testing.T, c kubernetes.Interface, controller string) {
	t.Helper()
	l, err := c.CoordinationV1().Leases(splitLeaseNamespace).Get(context.Background(), leases.AllocatorLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("allocator Lease: %v", err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != controller {
		t.Fatalf("allocator Lease held by %v, want the controller %s", h, controller)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// startNodeAgent runs node n's agent (hookMain, as startAgent does) inside
// its namespace with the identity of its pod; at cleanup it is killed and
// its log searched for refused requests (checkNodeLog).
func (s *split) startNodeAgent(tp *topo, n string, cfg config.Config) *exec.Cmd {
	t := s.t
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := tp.command(n, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "OHX_HOOK="+string(b), "OHX_KUBECONFIG="+s.nodeKubeconfig(n), "OHX_NODE="+n,
		"OHX_METRICS="+s.metricsSocket(n))
	tp.startLogged(cmd, "agent "+n, func(log string) { checkNodeLog(t, n, log) })
	return cmd
}

// runAll starts a split install on cfg: the controller, and the agents
// of node1 and node2.
func (s *split) runAll(tp *topo, cfg config.Config) {
	s.t.Helper()
	s.runController(cfg, "onehop-controller-0", "")
	for _, n := range []string{"node1", "node2"} {
		s.startNodeAgent(tp, n, cfg)
	}
}

// metricsSocket is where node n's agent (startNodeAgent) serves its
// metrics: a Unix socket, which the test reaches from its own network
// namespace.
func (s *split) metricsSocket(n string) string { return filepath.Join(s.dir, "metrics-"+n+".sock") }
