package l2

import (
	"fmt"
	"time"
)

// Config is the "l2" section of the external configuration.
type Config struct {
	// Interfaces answer ARP/NDP; default: the interface holding the node's
	// InternalIP.
	Interfaces []string `json:"interfaces,omitempty"`
	// LeaseRenewSeconds (default 1) and LeaseDurationSeconds (default 3)
	// tune the per-node liveness Lease: a node whose Lease was not renewed
	// for LeaseDurationSeconds loses its IPs to the next owner.
	LeaseRenewSeconds    float64 `json:"leaseRenewSeconds,omitempty"`
	LeaseDurationSeconds float64 `json:"leaseDurationSeconds,omitempty"`
	// Heartbeat tunes the heartbeats between the nodes (package
	// external/heartbeat), which are on when the key file holds a key:
	// the agents then judge each other by them, and a dead node's IPs
	// move in well under a second, with the apiserver up or down. Without
	// a key, the Leases alone.
	Heartbeat *HeartbeatConfig `json:"heartbeat,omitempty"`
	// GratuitousIntervalSeconds, when above 0 (default 0: off), makes the
	// owner announce each of its IPs again every so many seconds, give or
	// take GratuitousJitterSeconds (default a tenth of the interval), in
	// both ARP forms or as an unsolicited neighbour advertisement: for
	// switches whose forwarding entries age out before the routers' ARP
	// entries, and neighbours that ignored an announcement (as MetalLB's
	// periodic announcements, its speaker's gratuitous ARP interval).
	GratuitousIntervalSeconds float64 `json:"gratuitousIntervalSeconds,omitempty"`
	GratuitousJitterSeconds   float64 `json:"gratuitousJitterSeconds,omitempty"`
}

// Validate checks the numbers of c.
func (c *Config) Validate() error {
	switch {
	case c.GratuitousIntervalSeconds < 0 || c.GratuitousIntervalSeconds > 0 && c.GratuitousIntervalSeconds < 1:
		return fmt.Errorf("l2.gratuitousIntervalSeconds %v: want 1 or more (0: off)", c.GratuitousIntervalSeconds)
	case c.GratuitousJitterSeconds < 0 || c.GratuitousJitterSeconds > c.GratuitousIntervalSeconds/2:
		return fmt.Errorf("l2.gratuitousJitterSeconds %v: want 0 to half the interval %v", c.GratuitousJitterSeconds, c.GratuitousIntervalSeconds)
	}
	return c.Heartbeat.Validate()
}

// Periodic is the interval and the jitter of the periodic announcements
// (zero: off).
func (c *Config) Periodic() (every, jitter time.Duration) {
	if c == nil || c.GratuitousIntervalSeconds <= 0 {
		return 0, 0
	}
	every = time.Duration(c.GratuitousIntervalSeconds * float64(time.Second))
	jitter = every / 10
	if c.GratuitousJitterSeconds > 0 {
		jitter = time.Duration(c.GratuitousJitterSeconds * float64(time.Second))
	}
	return every, jitter
}

// HeartbeatConfig configures the heartbeats between the L2 nodes.
type HeartbeatConfig struct {
	// KeyFile holds the key every node shares, at least 16 bytes, white
	// space around it trimmed (default /etc/onehop/l2-heartbeat/key, where
	// deploy/ mounts the Secret onehop-l2-heartbeat). Several keys, one a
	// line, while a key is replaced: the first signs, all are accepted.
	// A missing or empty file turns the heartbeats off.
	KeyFile string `json:"keyFile,omitempty"`
	// Port is the UDP port, on the node's InternalIP (default 7947).
	Port int `json:"port,omitempty"`
	// IntervalMillis between two heartbeats (default 100), and Missed,
	// how many a node may miss before it is dead (default 3).
	IntervalMillis int `json:"intervalMillis,omitempty"`
	Missed         int `json:"missed,omitempty"`
	// RestartHoldSeconds is how long the other nodes keep the IPs of a
	// node whose agent stopped to start again (a rolling update), while
	// the node answers echo requests (default 10; 0: off, its IPs move at
	// once). Its kernel still forwards meanwhile, so no connection breaks
	// as the IPs would move away and back. An agent stops so when its
	// Node stays (not cordoned, not being deleted); a drained node's
	// agent hands its IPs over at once. A node that stops answering echo
	// requests is dead at once; an agent that does not come back in time
	// loses its IPs when the hold ends.
	RestartHoldSeconds *float64 `json:"restartHoldSeconds,omitempty"`
}

// DefaultRestartHold is HeartbeatConfig.RestartHoldSeconds' default.
const DefaultRestartHold = 10 * time.Second

// RestartHold is c's restart hold (DefaultRestartHold when unset).
func (c *HeartbeatConfig) RestartHold() time.Duration {
	if c == nil || c.RestartHoldSeconds == nil {
		return DefaultRestartHold
	}
	return time.Duration(*c.RestartHoldSeconds * float64(time.Second))
}

// Validate checks the numbers of c (nil: no heartbeats).
func (c *HeartbeatConfig) Validate() error {
	switch {
	case c == nil:
		return nil
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("l2.heartbeat.port %d is no UDP port", c.Port)
	case c.IntervalMillis < 0 || c.IntervalMillis > 0 && c.IntervalMillis < 10:
		return fmt.Errorf("l2.heartbeat.intervalMillis %d: want 10 or more", c.IntervalMillis)
	case c.Missed < 0:
		return fmt.Errorf("l2.heartbeat.missed %d: want 1 or more", c.Missed)
	case c.RestartHoldSeconds != nil && (*c.RestartHoldSeconds < 0 || *c.RestartHoldSeconds > 600):
		return fmt.Errorf("l2.heartbeat.restartHoldSeconds %v: want 0 (off) to 600", *c.RestartHoldSeconds)
	}
	return nil
}
