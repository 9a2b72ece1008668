package soak

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"time"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
	"github.com/onehop/onehop/test/procstat"
)

// Sample is one reading of the agent and its node.
type Sample struct {
	At         time.Duration // since the churn began
	RSS        float64       // VmRSS, bytes
	Heap       float64       // go_memstats_heap_inuse_bytes
	Goroutines float64       // go_goroutines
	FDs        int           // entries of /proc/<pid>/fd
	Elements   int           // set and map elements in table inet onehop
	Conntrack  int           // conntrack entries in the node's namespace
	Services   int           // churned Services, as last written
	Changes    int64         // changes made so far
	Load       string        // the machine's load average
}

// sampler reads one node's agent from outside: /proc, its /metrics, and
// the kernel state of the node's namespace.
type sampler struct {
	node    *netns.Node
	http    *http.Client
	kernel  *kernel
	ct      *conntrack
	metrics string
}

func newSampler(node *netns.Node) (*sampler, error) {
	path := filepath.Join(nsutil.Dir, node.Netns)
	k, err := openKernel(path)
	if err != nil {
		return nil, err
	}
	ct, err := openConntrack(path)
	if err != nil {
		k.Close()
		return nil, err
	}
	return &sampler{
		node:    node,
		http:    &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: nsutil.Dialer(node.Netns), DisableKeepAlives: true}},
		kernel:  k,
		ct:      ct,
		metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", netns.MetricsPort),
	}, nil
}

func (s *sampler) Close() {
	s.kernel.Close()
	s.ct.Close()
}

// Metrics scrapes the agent.
func (s *sampler) Metrics(ctx context.Context) (procstat.Metrics, error) {
	return procstat.Scrape(ctx, s.http, s.metrics)
}

// Take reads every measure once.
func (s *sampler) Take(ctx context.Context) (Sample, error) {
	agent := s.node.Agent()
	if done, err := agent.Exited(); done {
		return Sample{}, fmt.Errorf("the agent on %s exited: %v", s.node.Name, err)
	}
	pid := agent.Pid()
	smp := Sample{Load: procstat.LoadAvg()}
	mem, err := procstat.Memory(pid)
	if err != nil {
		return smp, err
	}
	smp.RSS = mem["VmRSS"]
	if smp.FDs, err = procstat.FDs(pid); err != nil {
		return smp, err
	}
	m, err := s.Metrics(ctx)
	if err != nil {
		return smp, fmt.Errorf("agent metrics: %w", err)
	}
	smp.Heap, smp.Goroutines = m["go_memstats_heap_inuse_bytes"], m["go_goroutines"]
	// A dump can fail while the agent rewrites the table; one is read
	// again, a few times.
	var r *Ruleset
	for range 5 {
		if r, err = s.kernel.Read(false); err == nil {
			break
		}
	}
	if err != nil {
		return smp, err
	}
	smp.Elements = r.Elements()
	flows, err := s.ct.Flows()
	if err != nil {
		return smp, fmt.Errorf("conntrack: %w", err)
	}
	smp.Conntrack = len(flows)
	return smp, nil
}
