package providers

import (
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/onehop/onehop/external/leases"
)

// defendEvery bounds how often this node announces an IP again because
// another host announced it (RFC 5227's DEFEND_INTERVAL).
const defendEvery = 10 * time.Second

// probeWait is how long a takeover from a node judged dead waits for an
// answer to its probe (probeTakeovers).
const probeWait = 200 * time.Millisecond

// l2Conflicts settles another host announcing an IP this node answers for
// (the responder's OnConflict): one node answers for an IP at every
// moment, even when the nodes' views of the Leases differ for a while.
//
// The announcer, if a node's Lease publishes its link-layer address, is
// alive (leases.Liveness.HeardFrom), and the IP's owner is computed again
// with it. The lower-ranked node yields: if the IP is no longer this node's,
// the hook is woken and this node stops answering; if it still is, this
// node defends it by announcing it again, at most once per defendEvery,
// so that the neighbours come back to it and the other node, hearing
// that, yields in turn. An announcer no Lease names (a host that is not a
// node, a misconfigured one) is answered by the defence alone.
//
// Before this node takes an IP over from a node judged dead, it probes
// for it (probeTakeovers): a node that still answers (its agent cut off
// from the apiserver but serving, its Lease's renewals late) is alive, and
// keeps the IP. A node that said it stops (its last heartbeat, its Lease
// deleted) is not probed for: its IPs are taken over at once. Then a node whose Lease expired while it still answers
// is not joined by a second one.
type l2Conflicts struct {
	// announce announces IPs again (the responder's Reannounce); probe
	// asks who answers for IPs (its Probe).
	announce func([]netip.Addr)
	probe    func([]netip.Addr, time.Duration) map[netip.Addr]net.HardwareAddr
	lv       *leases.Liveness
	poke     func()
	log      *slog.Logger
	// stopping, when set, says this node is stopping: its last heartbeat
	// said it leaves, another node is taking its IPs over, and it must
	// not defend them against that node while its responder closes.
	stopping func() bool

	mu sync.Mutex
	// last is the state the provider was last told: the owner is
	// computed again over it, with the liveness of now.
	last     *State
	defended map[netip.Addr]time.Time
}

// told records the state the provider is told.
func (c *l2Conflicts) told(s *State) {
	c.mu.Lock()
	c.last = s
	c.mu.Unlock()
}

// heard handles mac announcing ip, which the responder answers for.
func (c *l2Conflicts) heard(ip netip.Addr, mac net.HardwareAddr) {
	if c.stopping != nil && c.stopping() {
		return
	}
	node := c.lv.NodeOf(mac)
	c.lv.HeardFrom(node)
	c.mu.Lock()
	s := c.last
	c.mu.Unlock()
	if s == nil {
		return
	}
	if owner, _ := L2Owner(s, ip); owner != s.Node || !s.Serves(ip) {
		c.log.Info("l2 yield: another node announces an IP it outranks this one for", "ip", ip, "node", node, "mac", mac.String(), "owner", owner)
		c.poke()
		return
	}
	now := time.Now()
	c.mu.Lock()
	if c.defended == nil {
		c.defended = map[netip.Addr]time.Time{}
	}
	defend := now.Sub(c.defended[ip]) >= defendEvery
	if defend {
		c.defended[ip] = now
	}
	c.mu.Unlock()
	if defend {
		c.log.Info("l2 defend: another host announces an IP this node owns", "ip", ip, "node", node, "mac", mac.String())
		c.announce([]netip.Addr{ip})
	}
}

// probeTakeovers probes the IPs this node is about to take over from a
// node judged dead (took: each with the node that owned it at the last
// look) and returns own without those a node still answers for. That node
// is alive (leases.Liveness.HeardFrom), and so the owner again if it
// outranks this one; once it is no longer heard, the next look probes
// again.
func (c *l2Conflicts) probeTakeovers(s *State, took map[netip.Addr]string, own []netip.Addr) []netip.Addr {
	var ask []netip.Addr
	for ip, from := range took {
		// A node that stopped cleanly said so: its responder is closing,
		// and one that answers the probe now would hold the IP back
		// for a lease duration while nobody answers for it.
		if !s.Alive(from) && !c.lv.Left(from) {
			ask = append(ask, ip)
		}
	}
	if len(ask) == 0 || c.probe == nil {
		return own
	}
	slices.SortFunc(ask, netip.Addr.Compare)
	answers := c.probe(ask, probeWait)
	if len(answers) == 0 {
		return own
	}
	var keep []netip.Addr
	for _, ip := range own {
		mac, ok := answers[ip]
		var node string
		if ok {
			node = c.lv.NodeOf(mac)
		}
		if node == "" || node == s.Node {
			keep = append(keep, ip)
			continue
		}
		c.log.Debug("l2: a node whose Lease expired still answers for an IP; it keeps it", "ip", ip, "node", node, "mac", mac.String())
		c.lv.HeardFrom(node)
	}
	return keep
}
