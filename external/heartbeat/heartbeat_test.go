package heartbeat

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// beating is a Heartbeat on a loopback address, running until the test
// ends or stop.
type beating struct {
	*Heartbeat
	changes atomic.Int32
	stop    context.CancelFunc
	done    chan struct{}
}

func startBeating(t *testing.T, node, addr string, port uint16, key string, inc uint64) *beating {
	t.Helper()
	b := &beating{done: make(chan struct{})}
	h, err := Listen(Config{Node: node, Incarnation: inc, Key: []byte(key), Bind: netip.AddrPortFrom(netip.MustParseAddr(addr), port),
		Interval: 20 * time.Millisecond}, slog.New(slog.NewTextHandler(t.Output(), nil)).With("node", node), func() { b.changes.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	b.Heartbeat = h
	ctx, cancel := context.WithCancel(context.Background())
	b.stop = func() { cancel(); <-b.done }
	go func() { defer close(b.done); h.Run(ctx) }()
	t.Cleanup(b.stop)
	return b
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// freePort finds a UDP port free on both loopback addresses the test uses.
func freePort(t *testing.T) uint16 {
	h, err := Listen(Config{Node: "probe", Key: []byte("k"), Bind: netip.MustParseAddrPort("127.0.0.1:0")}, slog.Default(), func() {})
	if err != nil {
		t.Fatal(err)
	}
	defer h.conn.Close()
	return netip.MustParseAddrPort(h.conn.LocalAddr().String()).Port()
}

// TestHeartbeatOverUDP: two nodes on loopback addresses see each other
// alive; one that stops sending (its link down, or killed) is dead after
// the timeout, one that stops cleanly at once; one with another key, or
// sending from another address than its own, is never known, and one that
// starts again under another key is no longer known.
func TestHeartbeatOverUDP(t *testing.T) {
	port := freePort(t)
	addrs := map[string]netip.Addr{"a": netip.MustParseAddr("127.0.0.1"), "b": netip.MustParseAddr("127.0.0.2"), "c": netip.MustParseAddr("127.0.0.3")}
	a := startBeating(t, "a", "127.0.0.1", port, "key", 1)
	b := startBeating(t, "b", "127.0.0.2", port, "key", 1)
	c := startBeating(t, "c", "127.0.0.3", port, "another key", 1)
	for _, h := range []*beating{a, b, c} {
		h.SetPeers(addrs)
	}
	alive := func(h *beating, n string) bool { ok, _, _ := h.Alive(n); return ok }
	waitUntil(t, "a and b alive to each other", func() bool { return alive(a, "b") && alive(b, "a") })

	var up atomic.Bool
	up.Store(true)
	b.SetUp(up.Load)
	before := a.changes.Load()
	up.Store(false)
	waitUntil(t, "b, down, dead to a", func() bool { return !alive(a, "b") })
	waitUntil(t, "a told", func() bool { return a.changes.Load() > before })
	up.Store(true)
	waitUntil(t, "b, up again, alive to a", func() bool { return alive(a, "b") })

	b.stop()
	waitUntil(t, "b, stopped cleanly, dead to a", func() bool { return !alive(a, "b") })
	// An impostor on c's address claiming to be b, with the key and a
	// higher incarnation, is refused: a datagram is taken only from its
	// node's address.
	d := startBeating(t, "b", "127.0.0.3", port+1, "key", 99)
	d.mu.Lock()
	d.cfg.Bind = netip.AddrPortFrom(d.cfg.Bind.Addr(), port) // it sends to a's port
	d.mu.Unlock()
	d.SetPeers(map[string]netip.Addr{"a": addrs["a"]})
	waitUntil(t, "the impostor sending", func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.seq > 20 })
	if alive(a, "b") {
		t.Error("b's impostor made it alive to a")
	}
	// b's agent starts again with a key a lacks: a judges b otherwise.
	b2 := startBeating(t, "b", "127.0.0.2", port, "another key", 2)
	b2.SetPeers(addrs)
	waitUntil(t, "b, under another key, not known to a", func() bool { _, known, _ := a.Alive("b"); return !known })
	if _, known, _ := a.Alive("c"); known {
		t.Error("c, with another key, known to a")
	}
	if _, known, _ := c.Alive("a"); known {
		t.Error("a known to c, which has another key")
	}
	// a's stats: b unheard now (another key), c never heard; what it took
	// and refused, by reason.
	st := a.Stats()
	if st.Alive != 0 || st.Dead != 0 || st.Unheard != 2 || st.Received == 0 ||
		st.Refused[RefusedBadMAC] == 0 || st.Refused[RefusedSource] == 0 || st.Refused[RefusedMalformed] != 0 {
		t.Errorf("a's stats %+v: want b and c unheard, datagrams taken, refused under another key and from a wrong address, none malformed", st)
	}
	if st := c.Stats(); st.Alive != 1 || st.Refused[RefusedBadMAC] == 0 {
		t.Errorf("c's stats %+v: want b's new incarnation (c's key) alive, a's datagrams (another key) refused", st)
	}
}

// TestRefusedReason: each way a datagram is refused has its reason.
func TestRefusedReason(t *testing.T) {
	for err, want := range map[error]string{
		ErrBadMAC: RefusedBadMAC, ErrReplay: RefusedReplay, ErrNotPeer: RefusedNotPeer,
		errWrongSource: RefusedSource, ErrMalformed: RefusedMalformed,
	} {
		if got := refusedReason(fmt.Errorf("wrapped: %w", err)); got != want {
			t.Errorf("%v: %s, want %s", err, got, want)
		}
	}
}
