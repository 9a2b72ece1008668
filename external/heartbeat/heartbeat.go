package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"sync"
	"time"
)

// DefaultPort is the UDP port heartbeats are sent to and from: one above
// MetalLB's memberlist (7946), so both can run on a node while moving
// from MetalLB.
const DefaultPort = 7947

// Defaults of Config.
const (
	DefaultInterval = 100 * time.Millisecond
	DefaultMissed   = 3
)

// Config is one node's heartbeat.
type Config struct {
	// Node names this node in its datagrams.
	Node string
	// Incarnation must grow with each start of the agent (the start
	// time in nanoseconds).
	Incarnation uint64
	// Key authenticates the datagrams this node sends; every node must
	// share it. Datagrams are also taken under the Accept keys: while a
	// key is replaced, each node sends under one key and takes both.
	Key    []byte
	Accept [][]byte
	// Bind is the node's address and the port; the datagrams are sent
	// from it, to the same port on each peer.
	Bind netip.AddrPort
	// Interval between two datagrams to each peer (DefaultInterval), and
	// how many a peer may miss before it is dead (DefaultMissed).
	Interval time.Duration
	Missed   int
	// RestartHold is how long a peer that said it restarts stays alive
	// while its node answers echo requests (Peers); 0: such a peer is
	// taken as leaving.
	RestartHold time.Duration
}

// Heartbeat sends this node's datagrams and follows its peers'.
type Heartbeat struct {
	cfg     Config
	conn    *net.UDPConn
	log     *slog.Logger
	changed func()

	mu      sync.Mutex
	peers   *Peers
	targets map[string]netip.AddrPort
	bySrc   map[netip.Addr]string
	seq     uint64
	// up says whether this node may send (its L2 links are up); nil: always.
	up func() bool
	// said is when a rejected datagram of each source was last logged.
	said map[netip.Addr]time.Time
	// beforeLeave, when set, runs before the datagram saying this node
	// leaves is sent; restarting, when set, says whether it says instead
	// that it restarts.
	beforeLeave func()
	restarting  func() bool
	// echo is open while a peer is held (echo.go); Run's goroutine alone
	// opens and closes it.
	echo *echoer
	// received counts the datagrams taken, refused those refused by
	// reason (Stats).
	received uint64
	refused  map[string]uint64
}

// The reasons a datagram is refused (Stats.Refused).
const (
	RefusedMalformed = "malformed"    // not a heartbeat
	RefusedBadMAC    = "bad_mac"      // under no key this node holds
	RefusedReplay    = "replay"       // not newer than the last taken from its node
	RefusedSource    = "wrong_source" // not from its node's address
	RefusedNotPeer   = "not_peer"     // from a node that is no peer
)

// refusedReason is the reason a datagram was refused with err.
func refusedReason(err error) string {
	switch {
	case errors.Is(err, ErrBadMAC):
		return RefusedBadMAC
	case errors.Is(err, ErrReplay):
		return RefusedReplay
	case errors.Is(err, ErrNotPeer):
		return RefusedNotPeer
	case errors.Is(err, errWrongSource):
		return RefusedSource
	}
	return RefusedMalformed
}

// errWrongSource: a datagram names a node whose address is another.
var errWrongSource = errors.New("heartbeat: not sent from its node's address")

// Stats are a node's heartbeats since it started, for its metrics.
type Stats struct {
	// Alive, Dead: the peers whose heartbeats decide, alive or dead now;
	// Unheard: those never heard (or not under a key this node holds),
	// judged otherwise.
	Alive, Dead, Unheard int
	// Received counts the datagrams taken, Refused those refused by
	// reason (Refused* constants).
	Received uint64
	Refused  map[string]uint64
}

// Stats says how the peers' heartbeats stand now.
func (h *Heartbeat) Stats() Stats {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	st := Stats{Received: h.received, Refused: maps.Clone(h.refused)}
	for n := range h.targets {
		switch alive, known, _ := h.peers.State(n, now); {
		case !known:
			st.Unheard++
		case alive:
			st.Alive++
		default:
			st.Dead++
		}
	}
	return st
}

// Listen binds cfg.Bind. changed is called (from Run's goroutines) when a
// peer becomes alive or dead.
func Listen(cfg Config, log *slog.Logger, changed func()) (*Heartbeat, error) {
	if len(cfg.Key) == 0 {
		return nil, errors.New("heartbeat: no key")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Missed <= 0 {
		cfg.Missed = DefaultMissed
	}
	if _, err := Encode(cfg.Key, Message{Node: cfg.Node}); err != nil {
		return nil, err
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(cfg.Bind))
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	peers := NewPeers(time.Duration(cfg.Missed) * cfg.Interval)
	peers.SetRestartHold(cfg.RestartHold)
	return &Heartbeat{cfg: cfg, conn: conn, log: log, changed: changed,
		peers: peers, targets: map[string]netip.AddrPort{},
		bySrc: map[netip.Addr]string{}, said: map[netip.Addr]time.Time{}, refused: map[string]uint64{}}, nil
}

// Timeout is how long a peer stays alive after its last datagram.
func (h *Heartbeat) Timeout() time.Duration { return time.Duration(h.cfg.Missed) * h.cfg.Interval }

// SetUp makes this node send only while up says so (nil: always).
func (h *Heartbeat) SetUp(up func() bool) {
	h.mu.Lock()
	h.up = up
	h.mu.Unlock()
}

// SetBeforeLeave makes Run call f when ctx ends, before it tells the
// peers this node leaves: what the peers take over once told must be
// given up first.
func (h *Heartbeat) SetBeforeLeave(f func()) {
	h.mu.Lock()
	h.beforeLeave = f
	h.mu.Unlock()
}

// SetRestarting makes Run, when ctx ends, tell the peers that this node
// restarts rather than leaves when f says so: its IPs then stay with it
// for the peers' restart hold (Peers), while its node still forwards.
func (h *Heartbeat) SetRestarting(f func() bool) {
	h.mu.Lock()
	h.restarting = f
	h.mu.Unlock()
}

// SetPeers makes these nodes, at these addresses, the peers; those of
// another address family than the bound address are left out. A peer's
// datagrams are taken only from its address.
func (h *Heartbeat) SetPeers(addrs map[string]netip.Addr) {
	family := h.cfg.Bind.Addr().Unmap().Is4()
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.targets)
	clear(h.bySrc)
	var names []string
	for n, a := range addrs {
		a = a.Unmap()
		if n == h.cfg.Node || !a.IsValid() || a.Is4() != family {
			continue
		}
		h.targets[n] = netip.AddrPortFrom(a, h.cfg.Bind.Port())
		h.bySrc[a] = n
		names = append(names, n)
	}
	h.peers.SetMembers(names)
}

// Alive is node's heartbeat liveness now (Peers.State).
func (h *Heartbeat) Alive(node string) (alive, known bool, last time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peers.State(node, time.Now())
}

// Left says whether node said it leaves in its last heartbeat (Peers.Left).
func (h *Heartbeat) Left(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peers.Left(node)
}

// Run sends and receives until ctx ends, then (after SetBeforeLeave's
// function) tells the peers this node leaves, or restarts
// (SetRestarting), and closes the socket.
func (h *Heartbeat) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(h.receive)
	send := time.NewTicker(h.cfg.Interval)
	defer send.Stop()
	// A peer is found dead within a quarter interval of its timeout.
	check := time.NewTicker(h.cfg.Interval / 4)
	defer check.Stop()
	h.send(Message{})
	defer func() {
		if h.echo != nil {
			h.echo.close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			h.mu.Lock()
			f, r := h.beforeLeave, h.restarting
			h.mu.Unlock()
			if f != nil {
				f()
			}
			restart := r != nil && r()
			h.send(Message{Leaving: !restart, Restarting: restart})
			_ = h.conn.Close()
			wg.Wait()
			return
		case <-send.C:
			h.send(Message{})
			h.echoHeld()
		case <-check.C:
			h.mu.Lock()
			dead := h.peers.Expire(time.Now())
			h.mu.Unlock()
			if len(dead) > 0 {
				h.log.Info("l2 heartbeat: peers missed their heartbeats", "nodes", dead, "timeout", h.Timeout())
				h.changed()
			}
		}
	}
}

// echoHeld sends an echo request to the node of each held peer, opening
// the echoer for the first and closing it after the last. Without it
// (no CAP_NET_RAW), a held peer is dead once its heartbeats are missed.
func (h *Heartbeat) echoHeld() {
	now := time.Now()
	h.mu.Lock()
	var to []netip.Addr
	for _, n := range h.peers.Held(now) {
		if a, ok := h.targets[n]; ok {
			to = append(to, a.Addr())
		}
	}
	h.mu.Unlock()
	switch {
	case len(to) == 0 && h.echo != nil:
		h.echo.close()
		h.echo = nil
	case len(to) > 0 && h.echo == nil:
		e, err := openEcho(h.cfg.Bind.Addr(), h.echoed)
		if err != nil {
			h.log.Warn("l2 heartbeat: cannot ask a restarting peer's node whether it is up; it is dead once its heartbeats are missed", "err", err)
			return
		}
		h.echo = e
	}
	if h.echo != nil {
		h.echo.send(to)
	}
}

// echoed takes an echo reply from a.
func (h *Heartbeat) echoed(a netip.Addr, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n, ok := h.bySrc[a]; ok {
		h.peers.Echoed(n, at)
	}
}

// send sends one datagram to every peer, unless this node may not send
// (a last one, leaving or restarting, is sent all the same). m says
// whether it leaves or restarts; the rest is filled in.
func (h *Heartbeat) send(m Message) {
	last := m.Leaving || m.Restarting
	h.mu.Lock()
	if h.up != nil && !h.up() && !last {
		h.mu.Unlock()
		return
	}
	h.seq++
	m.Node, m.Incarnation, m.Seq = h.cfg.Node, h.cfg.Incarnation, h.seq
	b, err := Encode(h.cfg.Key, m)
	to := make([]netip.AddrPort, 0, len(h.targets))
	for _, a := range h.targets {
		to = append(to, a)
	}
	h.mu.Unlock()
	if err != nil {
		return
	}
	for _, a := range to {
		// A peer that is down makes the kernel answer with errors
		// (ICMP unreachable): its missing datagrams say it already.
		_, _ = h.conn.WriteToUDPAddrPort(b, a)
	}
}

func (h *Heartbeat) receive() {
	buf := make([]byte, MaxSize+1)
	for {
		n, from, err := h.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // an ICMP error of an earlier send
		}
		src := from.Addr().Unmap()
		m, err := Decode(buf[:n], append([][]byte{h.cfg.Key}, h.cfg.Accept...)...)
		now := time.Now()
		h.mu.Lock()
		changed := false
		switch {
		case err == nil && h.bySrc[src] != m.Node:
			err = fmt.Errorf("%w: %s sent from %s", errWrongSource, m.Node, src)
		case err == nil:
			changed, err = h.peers.Accept(m, now)
		case errors.Is(err, ErrBadMAC) && h.bySrc[src] != "":
			// Its node restarted with a key this one lacks: judged by
			// its Lease until it is heard under a shared key again.
			changed = h.peers.Unverified(h.bySrc[src])
		}
		if err != nil {
			h.refused[refusedReason(err)]++
		} else {
			h.received++
		}
		say := err != nil && !errors.Is(err, ErrReplay) && now.Sub(h.said[src]) >= time.Minute
		if say {
			h.said[src] = now
		}
		h.mu.Unlock()
		if say {
			// Most often a key that differs between nodes: that peer is
			// then judged by its Lease.
			h.log.Warn("l2 heartbeat: datagram refused (logged once a minute per source)", "from", src, "err", err)
		}
		if changed {
			h.changed()
		}
	}
}
