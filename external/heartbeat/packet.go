package heartbeat

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Message is what one heartbeat says.
type Message struct {
	// Node is the sender's node name.
	Node string
	// Incarnation grows with each start of the sender's agent.
	Incarnation uint64
	// Seq grows with each datagram of one incarnation.
	Seq uint64
	// Leaving: the sender stops (a clean stop); it is dead from now.
	Leaving bool
	// Restarting: the sender's agent stops to start again (a rolling
	// update). Its node's kernel still forwards what it was given, so the
	// peers keep it alive for their restart hold while the node answers
	// echo requests (Peers.Accept). Agents that do not know the flag take
	// the datagram as an ordinary heartbeat and, once the next ones are
	// missed, the node as dead.
	Restarting bool
}

// The wire format, all integers big-endian:
//
//	"OHB" 1 | flags (1) | name length (1) | name | incarnation (8) | seq (8) | HMAC-SHA256 (32)
//
// The HMAC covers every byte before it.
const (
	magic          = "OHB\x01"
	flagLeaving    = 1
	flagRestarting = 2
	macLen         = sha256.Size
	// MaxNameLen is the longest node name a heartbeat carries (a Node's
	// name is a DNS subdomain: up to 253).
	MaxNameLen = 253
	// MaxSize bounds a heartbeat datagram.
	MaxSize = len(magic) + 2 + MaxNameLen + 16 + macLen
)

// Errors of Decode and Peers.Accept.
var (
	ErrMalformed = errors.New("heartbeat: malformed datagram")
	ErrBadMAC    = errors.New("heartbeat: authentication failed")
	ErrReplay    = errors.New("heartbeat: replayed or out-of-order datagram")
)

// Encode makes m's datagram, authenticated with key.
func Encode(key []byte, m Message) ([]byte, error) {
	if len(m.Node) == 0 || len(m.Node) > MaxNameLen {
		return nil, fmt.Errorf("heartbeat: node name of %d bytes", len(m.Node))
	}
	b := make([]byte, 0, MaxSize)
	b = append(b, magic...)
	var flags byte
	if m.Leaving {
		flags |= flagLeaving
	}
	if m.Restarting {
		flags |= flagRestarting
	}
	b = append(b, flags, byte(len(m.Node)))
	b = append(b, m.Node...)
	b = binary.BigEndian.AppendUint64(b, m.Incarnation)
	b = binary.BigEndian.AppendUint64(b, m.Seq)
	mac := hmac.New(sha256.New, key)
	mac.Write(b)
	return mac.Sum(b), nil
}

// Decode checks b's authentication with one of keys and returns its
// message.
func Decode(b []byte, keys ...[]byte) (Message, error) {
	const fixed = len(magic) + 2 + 16 + macLen
	if len(b) < fixed+1 || string(b[:len(magic)]) != magic {
		return Message{}, ErrMalformed
	}
	n := int(b[len(magic)+1])
	if n == 0 || len(b) != fixed+n {
		return Message{}, ErrMalformed
	}
	body, sum := b[:len(b)-macLen], b[len(b)-macLen:]
	ok := false
	for _, key := range keys {
		mac := hmac.New(sha256.New, key)
		mac.Write(body)
		ok = ok || hmac.Equal(mac.Sum(nil), sum)
	}
	if !ok {
		return Message{}, ErrBadMAC
	}
	p := len(magic)
	flags := b[p]
	p += 2
	m := Message{Node: string(b[p : p+n]), Leaving: flags&flagLeaving != 0, Restarting: flags&flagRestarting != 0}
	p += n
	m.Incarnation = binary.BigEndian.Uint64(b[p:])
	m.Seq = binary.BigEndian.Uint64(b[p+8:])
	return m, nil
}
