package nft

import (
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"
)

// errBadAttribute: a netlink attribute runs past its message.
var errBadAttribute = errors.New("netlink: bad attribute length")

// walkAttrs calls f with the type (flags cleared) and payload of each
// netlink attribute in b, in order. Reading a restarted agent's table
// decodes a few hundred thousand of them: walking the bytes in place
// allocates nothing, where a decoder per nesting level allocated a fifth
// of the read-back's memory.
func walkAttrs(b []byte, f func(typ uint16, data []byte) error) error {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofNlAttr || l > len(b) {
			return errBadAttribute
		}
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if err := f(typ, b[unix.SizeofNlAttr:l:l]); err != nil {
			return err
		}
		b = b[min((l+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1), len(b)):]
	}
	return nil
}

// walkMessages calls f with the header type and payload of each netlink
// message in a datagram.
func walkMessages(b []byte, f func(typ uint16, data []byte) error) error {
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return errors.New("netlink: bad message length")
		}
		if err := f(binary.NativeEndian.Uint16(b[4:]), b[unix.SizeofNlMsghdr:l:l]); err != nil {
			return err
		}
		b = b[min((l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
	}
	return nil
}
