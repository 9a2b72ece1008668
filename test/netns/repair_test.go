package netns_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestKernelRepairAtOnce: an endpoint element deleted from the onehop table
// with `nft`, which the agent's periodic check cannot see, is put back by
// the agent at once, counted in onehop_kernel_repairs_total, and the
// Service reaches both its pods.
func TestKernelRepairAtOnce(t *testing.T) {
	c := netns.NewForTest(t, netns.Config{Nodes: 1})
	ctx := ctxFor(t)
	node := c.Nodes[0]
	svc, since := expose(t, c, service("repaired", v1.ServiceTypeClusterIP, port("http", v1.ProtocolTCP, 80, netns.PortHTTP)), node.Pods)
	addr := hostPort(svc.Spec.ClusterIP, 80)
	from := node.Pods[0].Netns
	if _, err := netns.WaitBackends(ctx, from, "tcp", addr, node.Pods, since); err != nil {
		t.Fatal(err)
	}
	chain := "svc4/default/repaired/tcp/http"
	table, err := c.Nft(ctx, node, "list", "table", "inet", "onehop")
	if err != nil {
		t.Fatal(err)
	}
	m, keys := endpointElements(table, chain)
	if len(keys) != len(node.Pods) {
		t.Fatalf("%d endpoint elements of %s in the table, want %d:\n%s", len(keys), chain, len(node.Pods), table)
	}
	if out, err := c.Nft(ctx, node, "delete", "element", "inet", "onehop", m, "{", keys[0], "}"); err != nil {
		t.Fatalf("nft delete element: %v: %s", err, out)
	}
	deleted := time.Now()

	for {
		table, err := c.Nft(ctx, node, "list", "table", "inet", "onehop")
		if err != nil {
			t.Fatal(err)
		}
		if _, keys := endpointElements(table, chain); len(keys) == len(node.Pods) {
			break
		}
		if time.Since(deleted) > 5*time.Second {
			t.Fatalf("the deleted element is not back after %v", time.Since(deleted))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("element back after %v", time.Since(deleted).Round(time.Millisecond))
	if n := kernelRepairs(ctx, t, node); n != 1 {
		t.Errorf("onehop_kernel_repairs_total = %v, want 1", n)
	}
	if _, err := netns.WaitBackends(ctx, from, "tcp", addr, node.Pods, deleted); err != nil {
		t.Fatal(err)
	}
}

// endpointElements finds, in `nft list table` output, the flat map holding
// the endpoints of chain's cluster IP and their keys ("10.96.0.10 . tcp . 80 . 0").
func endpointElements(table, chain string) (m string, keys []string) {
	cur := ""
	sc := bufio.NewScanner(strings.NewReader(table))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if name, ok := strings.CutPrefix(l, "map "); ok {
			cur = strings.TrimSuffix(name, " {")
			continue
		}
		key, _, ok := strings.Cut(l, ` comment "cluster-ip `+chain+`"`)
		if !ok || !strings.HasPrefix(cur, "flat4-") {
			continue
		}
		key = strings.TrimSpace(strings.TrimPrefix(key, "elements = {"))
		m, keys = cur, append(keys, key)
	}
	return m, keys
}

// kernelRepairs reads onehop_kernel_repairs_total from node n's agent.
func kernelRepairs(ctx context.Context, t *testing.T, n *netns.Node) float64 {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: nsutil.Dialer(n.Netns)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", netns.MetricsPort), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `onehop_kernel_repairs_total{backend="nft"} `); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}
