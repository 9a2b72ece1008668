package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
)

// This file hears the kernel's nftables events and tells the changes
// someone else made to the onehop table (dataplane.Watcher).
//
// The kernel multicasts every committed transaction to the NFNLGRP_NFTABLES
// group: one message per object it changed, then NFT_MSG_NEWGEN. Each
// message's header carries the netlink port id of the socket that committed
// it, so a change from one of the backend's transaction sockets is its own
// (the port id is per socket: in one process, two backends do not take each
// other's changes for their own), and any other change to the table is
// someone else's.

const (
	// watchQuiet is how long a burst of foreign changes must be quiet
	// before it is reported, and watchMaxWait the longest a report waits.
	watchQuiet   = 50 * time.Millisecond
	watchMaxWait = 500 * time.Millisecond
	// watchMaxSeen bounds the distinct descriptions one report keeps.
	watchMaxSeen = 8
)

// ownPorts are the port ids of the transaction sockets a backend opened,
// the last few (a socket replaced after an error committed nothing since).
type ownPorts struct {
	mu  sync.Mutex
	ids []uint32
}

func (o *ownPorts) add(id uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.ids) == 4 {
		o.ids = o.ids[1:]
	}
	o.ids = append(o.ids, id)
}

func (o *ownPorts) has(id uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Contains(o.ids, id)
}

// portID is the netlink port id the kernel gave c.
func portID(c *netlink.Conn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var sa unix.Sockaddr
	var serr error
	if err := raw.Control(func(fd uintptr) { sa, serr = unix.Getsockname(int(fd)) }); err != nil {
		return 0, err
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if serr != nil || !ok {
		return 0, fmt.Errorf("netlink port id: %v", serr)
	}
	return nl.Pid, nil
}

// Watch implements dataplane.Watcher: it reports each burst of changes to
// table inet onehop that another socket committed, and lost events (the
// socket's buffer overflowed: ENOBUFS) as such.
func (b *Backend) Watch(ctx context.Context) (<-chan dataplane.KernelChange, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, b.socks.config())
	if err != nil {
		return nil, fmt.Errorf("nftables events: %w", err)
	}
	// Our own full sync of a large cluster is as many events as elements.
	if err := bigBuffers(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("nftables events: %w", err)
	}
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		c.Close()
		return nil, fmt.Errorf("nftables events: %w", err)
	}
	w := &watcher{own: b.socks.own, kick: make(chan struct{}, 1)}
	b.events.set(c, w)
	out := make(chan dataplane.KernelChange)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.read(c)
	}()
	go func() {
		<-ctx.Done()
		b.events.set(nil, nil)
		c.Close()
	}()
	go w.deliver(ctx, done, out)
	return out, nil
}

// watcher gathers the foreign changes read from the events socket until
// deliver hands them on.
type watcher struct {
	own  *ownPorts
	kick chan struct{} // a foreign change is waiting

	// batch describes the foreign changes of the transaction being read.
	batch []string

	mu     sync.Mutex
	seen   []string // distinct, at most watchMaxSeen
	counts map[string]int
	more   int // descriptions beyond watchMaxSeen
	lost   bool
}

// read reads events until the socket fails or is closed.
func (w *watcher) read(c *netlink.Conn) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	buf := make([]byte, 1<<16)
	// One closure, and recvfrom without a source address: a full sync of
	// ours is tens of thousands of events, read without allocating.
	var n int
	var rerr error
	recv := func(fd uintptr) bool {
		r, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
			unix.MSG_DONTWAIT|unix.MSG_TRUNC, 0, 0)
		n, rerr = int(r), nil
		if e != 0 {
			rerr = e
		}
		return rerr != unix.EAGAIN && rerr != unix.EINTR
	}
	for {
		err := raw.Read(recv)
		switch {
		case err != nil:
			return // closed
		case errors.Is(rerr, unix.ENOBUFS):
			w.batch = w.batch[:0] // part of it is gone
			w.note(nil, true)
			continue
		case rerr != nil:
			w.note(nil, true)
			return
		case n > len(buf): // truncated
			w.batch = w.batch[:0]
			w.note(nil, true)
			continue
		}
		w.datagram(buf[:n])
	}
}

// datagram reads the messages of one datagram.
func (w *watcher) datagram(b []byte) {
	ne := binary.NativeEndian
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(ne.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return
		}
		w.message(ne.Uint16(b[4:]), ne.Uint32(b[12:]), b[unix.NLMSG_HDRLEN:l])
		b = b[min(len(b), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
	}
}

// message looks at one event: typ and port are its header's type and port
// id, data its nfgenmsg and attributes.
func (w *watcher) message(typ uint16, port uint32, data []byte) {
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(data) < 4 {
		return
	}
	typ &= 0xff
	if typ == unix.NFT_MSG_NEWGEN { // the transaction is complete
		if len(w.batch) > 0 {
			w.note(w.batch, false)
			w.batch = w.batch[:0]
		}
		return
	}
	if data[0] != unix.NFPROTO_INET || w.own.has(port) {
		return
	}
	table, name := tableAndName(typ, data[4:])
	if table != TableName {
		return
	}
	w.batch = append(w.batch, describeEvent(typ, name))
}

// tableAndName returns the table an event's object is in, and the name of
// the object (a set element's set, a rule's chain). Every nftables object
// names its table in attribute 1; the name attribute differs.
func tableAndName(typ uint16, attrs []byte) (table, name string) {
	nameAttr := uint16(2) // NFTA_SET_NAME, NFTA_SET_ELEM_LIST_SET, NFTA_RULE_CHAIN, NFTA_OBJ_NAME
	if typ == unix.NFT_MSG_NEWCHAIN || typ == unix.NFT_MSG_DELCHAIN {
		nameAttr = unix.NFTA_CHAIN_NAME
	}
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return "", ""
	}
	for ad.Next() {
		switch ad.Type() {
		case 1:
			table = ad.String()
		case nameAttr:
			if typ != unix.NFT_MSG_NEWTABLE && typ != unix.NFT_MSG_DELTABLE {
				name = ad.String()
			}
		}
	}
	return table, name
}

// eventWords say what each kind of event changed; <name> is the object's
// name (a rule's chain, an element's set).
var eventWords = map[uint16]string{
	unix.NFT_MSG_NEWTABLE:   "table changed",
	unix.NFT_MSG_DELTABLE:   "table deleted",
	unix.NFT_MSG_NEWCHAIN:   "chain <name> added",
	unix.NFT_MSG_DELCHAIN:   "chain <name> deleted",
	unix.NFT_MSG_NEWRULE:    "rule added to chain <name>",
	unix.NFT_MSG_DELRULE:    "rule deleted from chain <name>",
	unix.NFT_MSG_NEWSET:     "set <name> added",
	unix.NFT_MSG_DELSET:     "set <name> deleted",
	unix.NFT_MSG_NEWSETELEM: "element added to <name>",
	unix.NFT_MSG_DELSETELEM: "element deleted from <name>",
}

// describeEvent says what an event changed, in a few words.
func describeEvent(typ uint16, name string) string {
	if w, ok := eventWords[typ]; ok {
		return strings.ReplaceAll(w, "<name>", name)
	}
	return fmt.Sprintf("nftables message %d for %q", typ, name)
}

// note records foreign changes (descs) or lost events, and wakes deliver.
func (w *watcher) note(descs []string, lost bool) {
	w.mu.Lock()
	if w.counts == nil {
		w.counts = map[string]int{}
	}
	for _, d := range descs {
		switch {
		case w.counts[d] > 0:
			w.counts[d]++
		case len(w.seen) < watchMaxSeen:
			w.seen = append(w.seen, d)
			w.counts[d] = 1
		default:
			w.more++
		}
	}
	w.lost = w.lost || lost
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// take returns what was noted since the last take, and forgets it.
func (w *watcher) take() dataplane.KernelChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := dataplane.KernelChange{Lost: w.lost}
	for _, d := range w.seen {
		if n := w.counts[d]; n > 1 {
			d = fmt.Sprintf("%s (%d times)", d, n)
		}
		c.Seen = append(c.Seen, d)
	}
	if w.more > 0 {
		c.Seen = append(c.Seen, fmt.Sprintf("%d more", w.more))
	}
	w.seen, w.counts, w.more, w.lost = nil, nil, 0, false
	return c
}

// deliver sends one KernelChange per burst of foreign changes: once they
// were quiet for watchQuiet, or watchMaxWait after the first. It closes out
// when ctx ends or the reader stopped (done).
func (w *watcher) deliver(ctx context.Context, done <-chan struct{}, out chan<- dataplane.KernelChange) {
	defer close(out)
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-w.kick:
		}
		deadline := time.Now().Add(watchMaxWait)
		quiet := time.NewTimer(watchQuiet)
	burst:
		for {
			select {
			case <-ctx.Done():
				quiet.Stop()
				return
			case <-w.kick:
				quiet.Reset(min(watchQuiet, time.Until(deadline)))
			case <-quiet.C:
				break burst
			}
		}
		select {
		case out <- w.take():
		case <-ctx.Done():
			return
		}
	}
}
