package watchscale

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/test/cluster"
)

// controlPlane skips t unless the control-plane binaries are at hand.
func controlPlane(t *testing.T) {
	t.Helper()
	if os.Getenv(cluster.EnvBinDir) == "" {
		t.Skipf("skipping: set %s to a directory with kube-apiserver and etcd (hack/controlplane.sh prints one)", cluster.EnvBinDir)
	}
}

// wantEvents is the watch set of the code, as watch events per change of
// each kind, summed over n agents each on its own node: every agent
// watches every Service and EndpointSlice once (one watch for the model
// and the hook, portal.ServiceWatch), every Node through the hook and its
// own Node through the model. Pods: split, an agent watches only its own node's (the change is
// to a Pod of node-0) and the controller settles the claims; otherwise
// every agent watches every Pod.
func wantEvents(mode string, n int) map[string]float64 {
	pods := float64(n)
	if modes[mode] {
		pods = 1
	}
	return map[string]float64{"pod": pods, "endpointslice": float64(n), "service": float64(n), "node": float64(n + 1)}
}

// TestWatchCounting: with 3 agents the counts are exactly what the watch
// set says (wantEvents), in both modes: the measurement counts what it
// claims to count.
func TestWatchCounting(t *testing.T) {
	controlPlane(t)
	for _, mode := range []string{"split", "all"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			r, err := run(ctx, slog.New(slog.NewTextHandler(t.Output(), nil)), mode, shape{nodes: 3, podsPerNode: 2, services: 3, claims: 1}, 2)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(r.row())
			for kind, want := range wantEvents(mode, 3) {
				if got := r.changes[kind].events; got != want {
					t.Errorf("%s change: the agents received %v watch events, want %v", kind, got, want)
				}
				if r.changes[kind].bytes <= 0 {
					t.Errorf("%s change: no bytes counted", kind)
				}
			}
		})
	}
}

// TestWatchScale measures the curve (ONEHOP_WATCHSCALE=1): for each number
// of agents in ONEHOP_WATCHSCALE_AGENTS (default 10,50,200,500), both modes,
// with ONEHOP_WATCHSCALE_PODS pods per node (default 2). Rows are appended
// to ONEHOP_WATCHSCALE_REPORT when set.
func TestWatchScale(t *testing.T) {
	if os.Getenv("ONEHOP_WATCHSCALE") != "1" {
		t.Skip("skipping: set ONEHOP_WATCHSCALE=1 (make bench-watch)")
	}
	controlPlane(t)
	sizes := []int{10, 50, 200, 500}
	if v := os.Getenv("ONEHOP_WATCHSCALE_AGENTS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 {
				t.Fatalf("ONEHOP_WATCHSCALE_AGENTS: %q is not a number of agents (2 or more)", f)
			}
			sizes = append(sizes, n)
		}
	}
	perNode := 2
	if v := os.Getenv("ONEHOP_WATCHSCALE_PODS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("ONEHOP_WATCHSCALE_PODS: %q", v)
		}
		perNode = n
	}
	var rows []string
	for _, n := range sizes {
		for _, mode := range []string{"split", "all"} {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
			r, err := run(ctx, slog.New(slog.NewTextHandler(t.Output(), nil)), mode, shape{nodes: n, podsPerNode: perNode, services: 20, claims: 4}, 5)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, r.row())
			t.Log(header + "\n" + r.row())
		}
	}
	t.Log("\n" + header + "\n" + strings.Join(rows, "\n"))
	if p := os.Getenv("ONEHOP_WATCHSCALE_REPORT"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fmt.Fprintf(f, "\n%s, %s\n\n%s\n%s\n", time.Now().UTC().Format(time.DateOnly), fmt.Sprintf("%d CPUs", runtime.NumCPU()), header, strings.Join(rows, "\n"))
	}
}

// header heads the rows of row.
const header = "| mode | agents = nodes | pods | watches per agent | pod change: events, KiB | EndpointSlice change | Service change | Node change | first listing, MiB (all agents) | load (1 min) |\n" +
	"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"

// row is r as a row of the table in docs/bench/watch.md.
func (r *result) row() string {
	cell := func(k string) string {
		c := r.changes[k]
		return fmt.Sprintf("%.0f, %.1f", c.events, c.bytes/1024)
	}
	return fmt.Sprintf("| %s | %d | %d | %.1f | %s | %s | %s | %s | %.1f | %s |", r.mode, r.agents, r.shape.nodes*r.shape.podsPerNode, r.watches,
		cell("pod"), cell("endpointslice"), cell("service"), cell("node"), float64(r.syncBytes)/(1<<20), load())
}

func load() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}
