package netns

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// NewForTest builds a cluster for t and tears it down in t.Cleanup. It skips
// t, with the reason, only when network namespaces are unusable (not root,
// no `ip netns`); any other start-up failure fails t. When t has failed, the
// cleanup first logs each node's agent log tail and nftables ruleset. An
// agent refused a request (RefusedRequests) fails t.
func NewForTest(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if err := nsutil.Available(); err != nil {
		t.Skipf("skipping namespace e2e test: %v", err)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("namespace cluster: %v", err)
	}
	t.Cleanup(func() {
		for _, l := range c.RefusedRequests() {
			t.Errorf("an agent was refused a request under deploy/base's RBAC: %s", l)
		}
		if t.Failed() {
			c.LogState(t)
		}
		c.Close()
	})
	return c
}

// LogState writes what helps debug a failure: agent logs and rulesets.
func (c *Cluster) LogState(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		t.Logf("=== %s agent log (tail):\n%s", n.Name, c.AgentLogTail(n, 6000))
		if out, err := c.DumpRules(ctx, n, "table"); err == nil {
			t.Logf("=== %s agent dump-rules:\n%s", n.Name, out)
		} else {
			t.Logf("=== %s agent dump-rules: %v", n.Name, err)
		}
		if out, err := c.DumpRules(ctx, n, "nft"); err == nil {
			t.Logf("=== %s agent dump-rules -o nft:\n%s", n.Name, out)
		} else {
			t.Logf("=== %s agent dump-rules -o nft: %v", n.Name, err)
		}
	}
}
