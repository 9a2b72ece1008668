package pressure

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// The agent binary is built once for every test of the run (as shipped:
// `make build`), unless $ONEHOP_AGENT names one.
var agentBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBuild.dir != "" {
		_ = os.RemoveAll(agentBuild.dir)
	}
	os.Exit(code)
}

// newCluster starts a namespace cluster for t (two nodes, two pods each,
// unless cfg says otherwise). It skips t without root or without the
// control-plane binaries, as the other end-to-end packages do.
func newCluster(t *testing.T, cfg netns.Config) *netns.Cluster {
	t.Helper()
	nsutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin, err := cluster.Binaries(ctx)
	if err != nil {
		t.Skipf("skipping: no control-plane binaries (%v); build them with hack/controlplane.sh or set %s", err, cluster.EnvBinDir)
	}
	agentBuild.once.Do(func() {
		if agentBuild.dir, agentBuild.err = os.MkdirTemp("", "onehop-pressure-"); agentBuild.err == nil {
			agentBuild.path, agentBuild.err = netns.AgentBinary(ctx, agentBuild.dir)
		}
	})
	if agentBuild.err != nil {
		t.Fatalf("agent binary: %v", agentBuild.err)
	}
	cfg.ControlPlaneBin, cfg.Agent = bin, agentBuild.path
	return netns.NewForTest(t, cfg)
}

// outage is how long the API server outage lasts:
// $ONEHOP_PRESSURE_OUTAGE (a Go duration), else two minutes.
func outage(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("ONEHOP_PRESSURE_OUTAGE")
	if v == "" {
		return 2 * time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("ONEHOP_PRESSURE_OUTAGE=%q: want a positive duration such as 30s", v)
	}
	return d
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
