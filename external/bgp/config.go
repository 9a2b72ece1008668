package bgp

import (
	"fmt"
	"net/netip"
)

// Config is the "bgp" section of the external configuration.
type Config struct {
	// ASN is the nodes' own AS number.
	ASN uint32 `json:"asn"`
	// RouterID defaults to the node's IPv4 next hop.
	RouterID string `json:"routerID,omitempty"`
	// ListenPort accepts incoming sessions; 0 (default) only connects out.
	ListenPort int32  `json:"listenPort,omitempty"`
	Peers      []Peer `json:"peers"`
	// NextHopIPv4/IPv6 override the next hops announced (default: the
	// node's InternalIP of each family).
	NextHopIPv4 string `json:"nextHopIPv4,omitempty"`
	NextHopIPv6 string `json:"nextHopIPv6,omitempty"`
}

// Peer is one BGP neighbour (a router).
type Peer struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	Port    uint16 `json:"port,omitempty"`
	// Password enables TCP MD5 authentication (RFC 2385).
	Password string `json:"password,omitempty"`
	// Multihop is the eBGP multihop TTL; 0 for a directly connected peer.
	Multihop uint8 `json:"multihop,omitempty"`
	// HoldTimeSeconds defaults to 90 (keepalive a third of it).
	HoldTimeSeconds uint64 `json:"holdTimeSeconds,omitempty"`
	// BFD detects a dead link in ~1 s instead of the hold time; the router
	// must run BFD too. BFDIntervalMillis defaults to 300, x3.
	BFD               bool   `json:"bfd,omitempty"`
	BFDIntervalMillis uint32 `json:"bfdIntervalMillis,omitempty"`
	// MaxPrefixes is how many routes of each address family the peer may
	// send (default DefaultMaxPrefixes). The speaker takes none of them,
	// but holds them as received; a peer that sends more has its session
	// ended, and it stays down until the peer's settings change or the
	// agent restarts.
	MaxPrefixes uint32 `json:"maxPrefixes,omitempty"`
	// GracefulRestart advertises graceful restart (RFC 4724): when the
	// agent restarts, or dies, the router keeps the node's routes as stale
	// for GracefulRestartSeconds (default DefaultRestartSeconds, at most
	// 4095) while the node's dataplane goes on serving them, and the agent
	// back announces them again and ends with End-of-RIB. The router must
	// help (BIRD and FRR do by default).
	GracefulRestart        bool   `json:"gracefulRestart,omitempty"`
	GracefulRestartSeconds uint16 `json:"gracefulRestartSeconds,omitempty"`
}

// DefaultRestartSeconds is the restart time a peer with graceful restart
// advertises unless told otherwise: MetalLB's (FRR's) and BIRD's.
const DefaultRestartSeconds = 120

// maxRestartSeconds is the largest restart time the capability carries
// (12 bits).
const maxRestartSeconds = 1<<12 - 1

// Validate reports the first configuration error.
func (c *Config) Validate() error {
	if c.ASN == 0 {
		return fmt.Errorf("bgp: asn is required")
	}
	if len(c.Peers) == 0 {
		return fmt.Errorf("bgp: at least one peer is required")
	}
	for _, p := range c.Peers {
		if _, err := netip.ParseAddr(p.Address); err != nil {
			return fmt.Errorf("bgp: peer address %q: %v", p.Address, err)
		}
		if p.ASN == 0 {
			return fmt.Errorf("bgp: peer %s: asn is required", p.Address)
		}
		if p.GracefulRestartSeconds > maxRestartSeconds {
			return fmt.Errorf("bgp: peer %s: gracefulRestartSeconds %d is over %d", p.Address, p.GracefulRestartSeconds, maxRestartSeconds)
		}
	}
	for _, s := range []string{c.RouterID, c.NextHopIPv4, c.NextHopIPv6} {
		if s == "" {
			continue
		}
		if _, err := netip.ParseAddr(s); err != nil {
			return fmt.Errorf("bgp: %q: %v", s, err)
		}
	}
	return nil
}
