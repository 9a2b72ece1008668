package leases

import (
	"net"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// AnnotationLinkAddrs, on a node's liveness Lease, lists the link-layer
// addresses its L2 responder answers with, comma-separated: the other
// nodes learn from it which node an announcement they hear comes from.
const AnnotationLinkAddrs = "onehop.io/l2-link-addresses"

// Liveness heard on the segment. A node announcing an IP on the segment is
// alive, whatever its Lease says (a node whose agent started again
// before its Lease's renewal came back, a node cut off from the apiserver
// that still answers). When an L2 responder hears another node announce
// an IP it answers for, that node counts as alive for a lease duration
// from then (HeardFrom), and the owner of the IP is computed again: the
// lower-ranked of the two yields, and only one of them answers.

// publish puts this node's link-layer addresses on its Lease (renewOnce).
func (l *Liveness) publish(lease *coordinationv1.Lease) {
	if l.linkAddrs == nil {
		return
	}
	addrs := strings.Join(l.linkAddrs(), ",")
	if addrs == "" {
		delete(lease.Annotations, AnnotationLinkAddrs)
		return
	}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[AnnotationLinkAddrs] = addrs
}

// publishedLocked records the link-layer addresses node's Lease publishes
// ("" when none, or the Lease is gone).
func (l *Liveness) publishedLocked(node, addrs string) {
	for mac, n := range l.byMAC {
		if n == node {
			delete(l.byMAC, mac)
		}
	}
	if node == l.node {
		return
	}
	for a := range strings.SplitSeq(addrs, ",") {
		if mac, err := net.ParseMAC(strings.TrimSpace(a)); err == nil {
			l.byMAC[mac.String()] = node
		}
	}
}

// NodeOf names the node whose Lease publishes mac ("" when none does).
func (l *Liveness) NodeOf(mac net.HardwareAddr) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byMAC[mac.String()]
}

// HeardFrom records that node was heard announcing on the segment now: it
// is alive for a lease duration from now. The hook is woken when that
// makes it alive.
func (l *Liveness) HeardFrom(node string) {
	if node == "" || node == l.node {
		return
	}
	l.mu.Lock()
	now := l.now()
	was := l.aliveLocked(node, now)
	l.heard[node] = now
	o := l.seen[node]
	say := !was && l.heardSaid[node] != o.rv
	if say {
		l.heardSaid[node] = o.rv
	}
	l.mu.Unlock()
	if say {
		l.log.Info("l2 liveness: a node whose Lease expired is heard on the segment; alive while it is", "node", node)
	}
	if !was {
		l.changed()
	}
}

// heardChangeLocked is the earliest moment a node alive because it was
// heard stops being so (zero: none), and forgets those heard too long ago.
func (l *Liveness) heardChangeLocked(now time.Time) time.Time {
	var next time.Time
	for n, h := range l.heard {
		exp := h.Add(l.duration)
		if !now.Before(exp) {
			delete(l.heard, n)
			continue
		}
		if next.IsZero() || exp.Before(next) {
			next = exp
		}
	}
	return next
}
