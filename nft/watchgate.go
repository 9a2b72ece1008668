package nft

import (
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// quietAbove is the number of element changes above which a transaction of
// the backend's own goes out while its events socket is out of the
// NFNLGRP_NFTABLES group. The kernel builds one event per element for each
// transaction when anyone listens: at 10k Services x 10 endpoints a restart
// that writes the flat maps anew took 1.7 s instead of 0.7 s with a
// listener, and a fresh full sync 1.7 s instead of 0.7 s.
const quietAbove = flatReadBackMax

// eventsGate takes the events socket out of its group for a large
// transaction of the backend's own, and back in after it. Another
// program's change in that window is not lost: the sync's generation check
// (genTracker) tells whether anything else committed, and if something did
// the watcher reports lost events, which the runner answers with a full
// comparison. The generation counts every commit in the network namespace,
// to any table: so that a neighbour committing often cannot keep the
// backend in a loop of quiet full syncs each followed by another, the
// transaction after such a report goes out with the socket in its group,
// and its events tell exactly what changed.
type eventsGate struct {
	mu   sync.Mutex
	c    *netlink.Conn // nil while nothing watches
	w    *watcher
	loud bool // the next large transaction keeps the socket in its group
}

func (g *eventsGate) set(c *netlink.Conn, w *watcher) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.c, g.w = c, w
}

// pause leaves the group; it reports whether resume has to rejoin.
func (g *eventsGate) pause() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c == nil {
		return false
	}
	if g.loud {
		g.loud = false
		return false
	}
	if err := g.c.LeaveGroup(unix.NFNLGRP_NFTABLES); err != nil {
		g.w.note(nil, true)
		return false
	}
	return true
}

// resume rejoins the group; alone says that nothing but the backend's own
// transaction committed while it was out.
func (g *eventsGate) resume(alone bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.c == nil {
		return
	}
	if err := g.c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil || !alone {
		g.w.note(nil, true)
		g.loud = true
	}
}
