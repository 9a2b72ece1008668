package leases

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

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

// ReadHeartbeatKeys reads the keys of c's key file (DefaultHeartbeatKeyFile
// when unset), one a line: the first signs, every one is accepted (a key
// being replaced). None, with why, when heartbeats are off.
func ReadHeartbeatKeys(c *l2.HeartbeatConfig) ([][]byte, string) {
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

// RegisterHeartbeatMetrics registers on reg the L2 heartbeats' metrics,
// read at each scrape from the heartbeats beats returns (nil while they
// are off: no series). A registry that holds them already (a hook built
// again on it) keeps the first.
func RegisterHeartbeatMetrics(reg prometheus.Registerer, beats func() *heartbeat.Heartbeat, log *slog.Logger) {
	if err := reg.Register(newHeartbeatCollector(beats)); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		log.Warn("l2 heartbeat metrics not registered", "err", err)
	}
}

// heartbeatCollector exposes the L2 heartbeats' state, read at each
// scrape: no series while heartbeats are off.
type heartbeatCollector struct {
	beats                    func() *heartbeat.Heartbeat
	peers, received, refused *prometheus.Desc
}

func newHeartbeatCollector(beats func() *heartbeat.Heartbeat) *heartbeatCollector {
	return &heartbeatCollector{beats: beats,
		peers: prometheus.NewDesc("onehop_l2_heartbeat_peers",
			"The other L2 nodes by their heartbeats now: alive, dead (missed them, or said they leave), or unheard "+
				"(none taken yet, or under a key this node lacks: judged by their Leases).", []string{"state"}, nil),
		received: prometheus.NewDesc("onehop_l2_heartbeats_received_total",
			"Heartbeat datagrams this node took from its peers.", nil, nil),
		refused: prometheus.NewDesc("onehop_l2_heartbeats_refused_total",
			"Heartbeat datagrams this node refused, by reason: bad_mac (under no key it holds), replay (not newer than "+
				"the last taken from that node), wrong_source (not from the node's address), not_peer (from a node with "+
				"no liveness Lease), malformed.", []string{"reason"}, nil),
	}
}

func (c *heartbeatCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.peers
	ch <- c.received
	ch <- c.refused
}

func (c *heartbeatCollector) Collect(ch chan<- prometheus.Metric) {
	hb := c.beats()
	if hb == nil {
		return
	}
	st := hb.Stats()
	for state, n := range map[string]int{"alive": st.Alive, "dead": st.Dead, "unheard": st.Unheard} {
		ch <- prometheus.MustNewConstMetric(c.peers, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(c.received, prometheus.CounterValue, float64(st.Received))
	for _, reason := range []string{heartbeat.RefusedBadMAC, heartbeat.RefusedReplay, heartbeat.RefusedSource, heartbeat.RefusedNotPeer, heartbeat.RefusedMalformed} {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.Refused[reason]), reason)
	}
}
