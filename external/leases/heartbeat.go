package external

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/external/heartbeat"
	"github.com/onehop/onehop/external/l2"
)

// Heartbeats between the L2 nodes. With a key (l2.heartbeat.keyFile),
// every agent sends a heartbeat to every other node with a liveness Lease,
// at its InternalIP, every 100 ms, and a node that misses 3 is dead for L2
// ownership: its IPs move in well under a second, with the apiserver up or
// down. The Leases stay the membership (who the peers are, and how a node
// never heard from is judged); a node's heartbeats, once one was taken,
// decide over its Lease. While this node's L2 links are all down it sends
// none and renews no Lease, and counts itself dead: it gives its IPs up,
// and the others take them. A stopping agent stops answering, then says
// in its last heartbeat that it leaves: the others take its IPs over at
// once, without probing for it.

// minHeartbeatKey is the shortest key taken.
const minHeartbeatKey = 16

// DefaultHeartbeatKeyFile is where the key is read from when
// l2.heartbeat.keyFile is not set: where deploy/ mounts the Secret
// onehop-l2-heartbeat.
const DefaultHeartbeatKeyFile = "/etc/onehop/l2-heartbeat/key"

// linkState is whether this node's L2 links are up, as last looked at.
type linkState struct{ down atomic.Bool }

func (s *linkState) up() bool { return !s.down.Load() }

// readHeartbeatKeys reads the keys of c's key file (DefaultHeartbeatKeyFile
// when unset), one a line: the first signs, every one is accepted (a key
// being replaced). None, with why, when heartbeats are off.
func readHeartbeatKeys(c *l2.HeartbeatConfig) ([][]byte, string) {
	file := DefaultHeartbeatKeyFile
	if c != nil && c.KeyFile != "" {
		file = c.KeyFile
	}
	b, err := os.ReadFile(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, "no key file " + file
	case err != nil:
		return nil, err.Error()
	}
	var keys [][]byte
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		key := bytes.TrimSpace(l)
		if len(key) == 0 {
			continue
		}
		if len(key) < minHeartbeatKey {
			return nil, "a key in " + file + " is shorter than 16 bytes"
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, "no key in " + file
	}
	return keys, ""
}

// internalIP is node's first InternalIP of the family of like (any family
// when like is not valid).
func (h *Hook) internalIP(node string, like netip.Addr) netip.Addr {
	obj, ok, _ := h.nodes.GetStore().GetByKey(node)
	if !ok {
		return netip.Addr{}
	}
	for _, a := range obj.(*corev1.Node).Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && (!like.IsValid() || ip.Unmap().Is4() == like.Is4()) {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// startHeartbeat follows this node's L2 links and, with a key, starts the
// heartbeats (goroutines of wg, until ctx ends). A heartbeat that cannot
// start is logged, and the Leases alone judge the nodes.
func (h *Hook) startHeartbeat(ctx context.Context, wg *sync.WaitGroup) {
	links := &linkState{}
	h.liveness.mu.Lock()
	h.liveness.linkUp = links.up
	h.liveness.mu.Unlock()
	c := h.conf().L2
	var hc l2.HeartbeatConfig
	if c != nil && c.Heartbeat != nil {
		hc = *c.Heartbeat
	}
	interval := heartbeat.DefaultInterval
	if hc.IntervalMillis > 0 {
		interval = time.Duration(hc.IntervalMillis) * time.Millisecond
	}
	wg.Go(func() { h.watchLinks(ctx, links, interval) })
	keys, why := readHeartbeatKeys(&hc)
	if keys == nil {
		h.log.Info("l2 heartbeats off: nodes are judged by their Leases alone", "why", why)
		return
	}
	self := h.internalIP(h.node, netip.Addr{})
	if !self.IsValid() {
		h.log.Warn("l2 heartbeats off: this node has no InternalIP to send them from; nodes are judged by their Leases alone", "node", h.node)
		return
	}
	port := hc.Port
	if port == 0 {
		port = heartbeat.DefaultPort
	}
	hb, err := heartbeat.Listen(heartbeat.Config{Node: h.node, Incarnation: uint64(time.Now().UnixNano()), Key: keys[0], Accept: keys[1:],
		Bind: netip.AddrPortFrom(self, uint16(port)), Interval: interval, Missed: hc.Missed, RestartHold: hc.RestartHold()}, h.log, h.livePoke)
	if err != nil {
		h.log.Warn("l2 heartbeats off: nodes are judged by their Leases alone", "err", err)
		return
	}
	hb.SetUp(links.up)
	// A clean stop: this node stops answering before it tells the others
	// it leaves. They take its IPs over at once, without a probe; were it
	// still answering, a reply of its own to their announcement would
	// make it alive again to them, and they would yield to it.
	hb.SetBeforeLeave(func() {
		h.mu.Lock()
		r := h.l2r
		h.mu.Unlock()
		if r != nil {
			r.Close()
		}
	})
	restarts := func() bool { return h.restartsOnStop(hc.RestartHold()) }
	hb.SetRestarting(restarts)
	h.mu.Lock()
	h.beats = hb
	h.mu.Unlock()
	h.liveness.mu.Lock()
	h.liveness.beats = hb
	h.liveness.restarting = restarts
	h.liveness.mu.Unlock()
	h.syncHeartbeatPeers()
	h.log.Info("l2 heartbeats on", "bind", netip.AddrPortFrom(self, uint16(port)), "interval", interval, "timeout", hb.Timeout())
	wg.Go(func() { hb.Run(ctx) })
}

// restartsOnStop says whether this agent, stopping, restarts rather than
// leaves: the restart hold is on and its Node stays (not cordoned, not
// being deleted). A drain cordons the node first, so that its agent hands
// its IPs over at once; a node shut down without one stops answering the
// others' echo requests, and is dead to them then.
func (h *Hook) restartsOnStop(hold time.Duration) bool {
	if hold <= 0 {
		return false
	}
	obj, ok, _ := h.nodes.GetStore().GetByKey(h.node)
	if !ok {
		return false
	}
	n := obj.(*corev1.Node)
	return !n.Spec.Unschedulable && n.DeletionTimestamp == nil
}

// syncHeartbeatPeers makes the nodes with a liveness Lease, at their
// InternalIPs, the heartbeats' peers.
func (h *Hook) syncHeartbeatPeers() {
	h.mu.Lock()
	hb := h.beats
	h.mu.Unlock()
	if hb == nil {
		return
	}
	self := h.internalIP(h.node, netip.Addr{})
	peers := map[string]netip.Addr{}
	for _, n := range h.liveness.members() {
		if ip := h.internalIP(n, self); ip.IsValid() && n != h.node {
			peers[n] = ip
		}
	}
	hb.SetPeers(peers)
}

// watchLinks looks at this node's L2 links every interval until ctx ends;
// when they all go down, or one comes up again, liveness changed.
func (h *Hook) watchLinks(ctx context.Context, s *linkState, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		r := h.l2r
		h.mu.Unlock()
		if r == nil {
			continue
		}
		down := !r.Up()
		if s.down.Swap(down) == down {
			continue
		}
		if down {
			h.log.Warn("l2: every interface this node answers on is down; it gives its IPs up, stops its heartbeats and its Lease")
		} else {
			h.log.Info("l2: an interface this node answers on is up again; it takes its IPs back")
		}
		h.livePoke()
	}
}
