package scale

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// profiler saves node 1's agent's pprof profiles into dir
// (ONEHOP_SCALE_PROFILES): CPU profiles back to back while a phase runs,
// and heap profiles. A nil profiler does nothing, so the test calls it
// unconditionally.
type profiler struct {
	dir  string
	node *netns.Node
	t    *testing.T
}

func newProfiler(t *testing.T, dir string, node *netns.Node) *profiler {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &profiler{dir: dir, node: node, t: t}
	t.Cleanup(p.keepLogs) // before the cluster's cleanup removes them
	return p
}

// keepLogs copies the logs of node 1's agents (one per start) next to the
// profiles.
func (p *profiler) keepLogs() {
	logs, _ := filepath.Glob(filepath.Join(filepath.Dir(p.node.Agent().Log), "agent-"+p.node.Name+".*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil {
			_ = os.WriteFile(filepath.Join(p.dir, filepath.Base(l)), b, 0o644)
		}
	}
}

func (p *profiler) client() *http.Client {
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DialContext: nsutil.Dialer(p.node.Netns), DisableKeepAlives: true}}
}

func (p *profiler) save(ctx context.Context, name, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", netns.MetricsPort, path), nil)
	if err != nil {
		return err
	}
	resp, err := p.client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	f, err := os.Create(filepath.Join(p.dir, name))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// heap saves a heap profile after a GC as <name>.heap.pprof.
func (p *profiler) heap(ctx context.Context, name string) {
	if p == nil {
		return
	}
	if err := p.save(ctx, name+".heap.pprof", "/debug/pprof/heap?gc=1"); err != nil {
		p.t.Logf("heap profile %s: %v", name, err)
	}
}

// cpu profiles the agent in chunks of seconds until the returned stop is
// called, as <name>-<n>.cpu.pprof; it waits for the agent's metrics
// server to answer first (it starts before the first sync). stop lets the
// chunk under way finish.
func (p *profiler) cpu(ctx context.Context, name string, seconds int) (stop func()) {
	if p == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := 0; ; {
			select {
			case <-done:
				return
			default:
			}
			err := p.save(ctx, fmt.Sprintf("%s-%d.cpu.pprof", name, n), fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds))
			if err == nil {
				n++
				continue
			}
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond): // not listening yet
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
