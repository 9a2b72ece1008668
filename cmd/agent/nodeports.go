package main

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/ipvs"
	"github.com/onehop/onehop/portal"
)

// nodePortSource serves NodePorts on the node's interface addresses inside
// nodePortAddresses' CIDRs, as kube-proxy does: it hands on the tracker's
// snapshots with the Node's NodePort addresses replaced by the matching
// local ones.
type nodePortSource struct {
	src   dataplane.SnapshotSource
	cidrs []netip.Prefix

	mu    sync.Mutex
	addrs []netip.Addr
}

func newNodePortSource(src dataplane.SnapshotSource, cidrs []netip.Prefix) *nodePortSource {
	return &nodePortSource{src: src, cidrs: cidrs}
}

// Snapshot is the source's snapshot with this node's matching addresses.
func (s *nodePortSource) Snapshot() (*portal.Snapshot, []time.Time) {
	snap, triggers := s.src.Snapshot()
	s.mu.Lock()
	snap.Node.NodePortAddrs = slices.Clone(s.addrs)
	s.mu.Unlock()
	return snap, triggers
}

// setLocal records the node's addresses and reports whether the NodePort
// addresses changed.
func (s *nodePortSource) setLocal(local []netip.Addr) bool {
	var match []netip.Addr
	for _, a := range local {
		for _, p := range s.cidrs {
			if p.Contains(a) {
				match = append(match, a)
				break
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Equal(match, s.addrs) {
		return false
	}
	s.addrs = match
	return true
}

// follow keeps the addresses in step with the interfaces of the network
// namespace behind netnsFD (-1: the agent's) until ctx ends, calling
// changed after each change. It returns once the first list is in, so that
// the first sync serves NodePorts where it should.
func (s *nodePortSource) follow(ctx context.Context, netnsFD int, log *slog.Logger, changed func()) error {
	first := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		errc <- dataplane.WatchLocalAddrs(ctx, netnsFD, log, []string{ipvs.DummyInterface}, func(addrs []netip.Addr) {
			firstCall := false
			once.Do(func() { firstCall = true })
			if s.setLocal(addrs) || firstCall {
				s.mu.Lock()
				mine := slices.Clone(s.addrs)
				s.mu.Unlock()
				if len(mine) == 0 {
					log.Warn("no interface address of this node is inside nodePortAddresses", "cidrs", s.cidrs, "node_addrs", addrs)
				} else {
					log.Info("NodePort addresses", "addrs", mine, "cidrs", s.cidrs)
				}
				changed()
			}
			if firstCall {
				close(first)
			}
		})
	}()
	select {
	case <-first:
		return nil
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
