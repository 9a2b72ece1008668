package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// batchSender sends the transactions google/nftables builds without asking
// the kernel to acknowledge every message. google/nftables sets NLM_F_ACK on
// each message and reads one acknowledgement per message: at tens of
// thousands of messages that is as many recvmsg calls, and as many skbs
// queued in the kernel, as there are messages. batchSender sits behind
// nftables' test-dial hook: it strips the flag from all but the last
// message, sends the batch on a real socket, waits for that last ack (or
// the errors), and hands nftables the acknowledgements it expects.
//
// A Flush sends nothing: the library's messages are kept, messages built
// outside it (setMessage, elemMessage) can be added after them, and
// sendHeld sends all of them, in order, as one transaction.
type batchSender struct {
	socks   *sockets
	pending []netlink.Message
	held    []netlink.Message
}

// newTxConn returns an nftables connection whose Flush goes through a
// batchSender, and the sender. Use it only to build and flush
// transactions; queries need a connection from newConn.
func newTxConn(socks *sockets) (*nftables.Conn, *batchSender, error) {
	s := &batchSender{socks: socks}
	c, err := nftables.New(nftables.WithTestDial(s.exchange))
	return c, s, err
}

// appendHeld adds messages to what the sender keeps, after the library's
// messages flushed so far.
func (s *batchSender) appendHeld(ms ...netlink.Message) { s.held = append(s.held, ms...) }

// sendHeld sends the held messages as one transaction and returns the
// kernel's verdict: nil when it committed them all.
func (s *batchSender) sendHeld() error {
	held := s.held
	s.held = nil
	if len(held) == 0 {
		return nil
	}
	var seq uint32 // messages built outside the library get numbers after its own
	for _, m := range held {
		seq = max(seq, m.Header.Sequence)
	}
	marker := func(typ uint16) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request},
			Data: []byte{0, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}}
	}
	req := make([]netlink.Message, 0, len(held)+2)
	req = append(req, marker(nfnlBatchBegin))
	for _, m := range held {
		if m.Header.Sequence == 0 {
			seq++
			m.Header.Sequence = seq
		}
		req = append(req, m)
	}
	req = append(req, marker(nfnlBatchEnd))
	_, failure, err := s.sendFailure(req)
	if err != nil {
		return err
	}
	return failure
}

const (
	nfnlBatchBegin = 0x10 // NFNL_MSG_BATCH_BEGIN
	nfnlBatchEnd   = 0x11 // NFNL_MSG_BATCH_END
)

func isBatchMarker(m netlink.Message) bool {
	t := uint16(m.Header.Type)
	return t == nfnlBatchBegin || t == nfnlBatchEnd
}

// exchange implements nltest.Func: a request is a batch to hold (sendHeld
// sends it); a nil request is nftables reading its next acknowledgement.
func (s *batchSender) exchange(req []netlink.Message) ([]netlink.Message, error) {
	if req == nil {
		if len(s.pending) == 0 {
			return nil, io.EOF
		}
		m := s.pending[0]
		s.pending = s.pending[1:]
		return []netlink.Message{m}, nil
	}
	var acks []netlink.Message
	s.held = slices.Grow(s.held, len(req))
	for _, m := range req {
		if !isBatchMarker(m) {
			s.held = append(s.held, m)
			acks = append(acks, ackFor(m, 0))
		}
	}
	if len(acks) == 0 {
		return nil, nil
	}
	s.pending = acks[1:]
	return acks[:1], nil
}

// sendFailure sends the batch req and returns an acknowledgement for each
// of its messages, and the kernel's error when it refused the batch (the
// first acknowledgement then carries it, which is what nftables reads);
// err is a failure to send or receive at all.
func (s *batchSender) sendFailure(req []netlink.Message) (acks []netlink.Message, failure, err error) {
	last := -1
	for i := range req {
		if isBatchMarker(req[i]) {
			continue
		}
		req[i].Header.Flags &^= netlink.Acknowledge
		last = i
	}
	if last < 0 {
		return nil, nil, nil
	}
	req[last].Header.Flags |= netlink.Acknowledge
	lastSeq := req[last].Header.Sequence

	conn, err := s.socks.txConn()
	if err != nil {
		return nil, nil, err
	}
	if err := sendBatch(conn, req); err != nil {
		s.socks.dropTx()
		return nil, nil, fmt.Errorf("send batch: %w", err)
	}
	for failure == nil {
		msgs, err := conn.Receive()
		if err != nil {
			// The kernel rejected a message: the whole batch was aborted.
			var op *netlink.OpError
			if errors.As(err, &op) {
				failure = op.Err
			} else {
				failure = err
			}
			// What else the kernel answered is still queued: the socket
			// is not used again.
			s.socks.dropTx()
			break
		}
		if ackedSeq(msgs, lastSeq) {
			break
		}
	}
	acks = make([]netlink.Message, 0, len(req))
	for _, m := range req {
		if isBatchMarker(m) {
			continue
		}
		code := int32(0)
		if failure != nil && len(acks) == 0 {
			code = -int32(errnoOf(failure))
		}
		acks = append(acks, ackFor(m, code))
	}
	return acks, failure, nil
}

// sendBatch writes req to the kernel in one datagram, marshalled into one
// buffer of the right size: netlink's SendMessages grows its buffer message
// by message, which for a full sync's tens of thousands of messages was a
// fifth of the sync's time in copying. Each message's length is set in
// req, as SendMessages does.
func sendBatch(conn *netlink.Conn, req []netlink.Message) error {
	const hdrLen = 16 // struct nlmsghdr
	align := func(n int) int { return (n + 3) &^ 3 }
	size := 0
	for i := range req {
		req[i].Header.Length = uint32(hdrLen + len(req[i].Data))
		size += align(int(req[i].Header.Length))
	}
	buf := make([]byte, size)
	ne := binary.NativeEndian
	off := 0
	for _, m := range req {
		ne.PutUint32(buf[off:], m.Header.Length)
		ne.PutUint16(buf[off+4:], uint16(m.Header.Type))
		ne.PutUint16(buf[off+6:], uint16(m.Header.Flags))
		ne.PutUint32(buf[off+8:], m.Header.Sequence)
		ne.PutUint32(buf[off+12:], m.Header.PID)
		copy(buf[off+hdrLen:], m.Data)
		off += align(int(m.Header.Length))
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	err = raw.Write(func(fd uintptr) bool {
		var n int
		n, werr = unix.Write(int(fd), buf)
		if werr == unix.EAGAIN || werr == unix.EINTR {
			return false // not yet: the poller waits until the socket can take it
		}
		if werr == nil && n != len(buf) {
			werr = fmt.Errorf("short write: %d of %d bytes", n, len(buf))
		}
		return true
	})
	if err != nil {
		return err
	}
	return werr
}

func errnoOf(err error) unix.Errno {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return unix.EIO
}

// ackedSeq reports whether msgs hold the acknowledgement of message seq.
func ackedSeq(msgs []netlink.Message, seq uint32) bool {
	for _, m := range msgs {
		if m.Header.Type == netlink.Error && len(m.Data) >= 4+16 && binary.NativeEndian.Uint32(m.Data[4+8:]) == seq {
			return true
		}
	}
	return false
}

// ackFor builds the acknowledgement (code 0) or error (negative errno) of m.
func ackFor(m netlink.Message, code int32) netlink.Message {
	ne := binary.NativeEndian
	data := make([]byte, 4+16)
	ne.PutUint32(data[0:], uint32(code))
	ne.PutUint32(data[4:], m.Header.Length)
	ne.PutUint16(data[8:], uint16(m.Header.Type))
	ne.PutUint16(data[10:], uint16(m.Header.Flags))
	ne.PutUint32(data[12:], m.Header.Sequence)
	ne.PutUint32(data[16:], m.Header.PID)
	return netlink.Message{Header: netlink.Header{Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID}, Data: data}
}
