package nft

import (
	"encoding/binary"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// elemMessage encodes the NEWSETELEM (add) or DELSETELEM message of els
// in set, byte for byte as google/nftables' SetAddElements and
// SetDeleteElements do (elemmsg_test.go compares them), straight into
// one buffer. A full sync sends a hundred thousand elements: through the
// library each became a SetElement, a list of attributes and three or
// four marshalled attribute buffers, half of the sync's allocations, and
// so most of its garbage collection.
//
// It encodes what onehop's elements use: a key (and an interval's end
// flag or key end), a timeout, a verdict, a value or neither, and a
// comment.
func elemMessage(set *nftables.Set, els []nftables.SetElement, add bool) netlink.Message {
	typ, size := unix.NFT_MSG_DELSETELEM, 4+attrLen(len(set.Name)+1)+attrLen(4)+attrLen(len(set.Table.Name)+1)+attrLen(0)
	if add {
		typ = unix.NFT_MSG_NEWSETELEM
	}
	for i := range els {
		size += elemLen(set, &els[i])
	}
	b := make([]byte, 0, size)
	b = append(b, byte(set.Table.Family), unix.NFNETLINK_V0, 0, 0)
	b = appendStrAttr(b, unix.NFTA_SET_ELEM_LIST_SET, set.Name)
	b = appendU32Attr(b, unix.NFTA_SET_ELEM_LIST_SET_ID, set.ID)
	b = appendStrAttr(b, unix.NFTA_SET_ELEM_LIST_TABLE, set.Table.Name)
	list := len(b)
	b = appendAttrHeader(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS|unix.NLA_F_NESTED)
	for i := range els {
		b = appendElem(b, set, uint16(i+1), &els[i])
	}
	endNested(b, list)
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ),
			Flags: netlink.Request | netlink.Acknowledge | netlink.Create,
		},
		Data: b,
	}
}

// attrLen is the aligned size of an attribute with n bytes of payload.
func attrLen(n int) int {
	return (unix.SizeofNlAttr + n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
}

// elemLen is the encoded size of one element (appendElem).
func elemLen(set *nftables.Set, e *nftables.SetElement) int {
	n := attrLen(attrLen(len(e.Key))) // KEY { DATA_VALUE }
	if e.IntervalEnd {
		n += attrLen(4)
	}
	if len(e.KeyEnd) > 0 {
		n += attrLen(attrLen(len(e.KeyEnd)))
	}
	if set.HasTimeout && e.Timeout != 0 {
		n += attrLen(8)
	}
	switch {
	case e.VerdictData != nil:
		in := attrLen(4)
		if e.VerdictData.Chain != "" {
			in += attrLen(len(e.VerdictData.Chain) + 1)
		}
		n += attrLen(attrLen(in))
	case len(e.Val) > 0:
		n += attrLen(attrLen(len(e.Val)))
	}
	if e.Comment != "" {
		n += attrLen(2 + len(e.Comment) + 1)
	}
	return attrLen(n)
}

// appendElem appends one element of the list, as the attribute of type
// idx (the library numbers them; the kernel reads them in order).
func appendElem(b []byte, set *nftables.Set, idx uint16, e *nftables.SetElement) []byte {
	elem := len(b)
	b = appendAttrHeader(b, idx|unix.NLA_F_NESTED)
	if e.IntervalEnd {
		// Marked nested, as the library marks it; the kernel reads the
		// flags all the same.
		b = appendU32Attr(b, unix.NFTA_SET_ELEM_FLAGS|unix.NLA_F_NESTED, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	key := len(b)
	b = appendAttrHeader(b, unix.NFTA_SET_ELEM_KEY|unix.NLA_F_NESTED)
	b = appendAttr(b, unix.NFTA_DATA_VALUE, e.Key)
	endNested(b, key)
	if len(e.KeyEnd) > 0 {
		end := len(b)
		b = appendAttrHeader(b, nftables.NFTA_SET_ELEM_KEY_END|unix.NLA_F_NESTED)
		b = appendAttr(b, unix.NFTA_DATA_VALUE, e.KeyEnd)
		endNested(b, end)
	}
	if set.HasTimeout && e.Timeout != 0 {
		at := len(b)
		b = appendAttrHeader(b, unix.NFTA_SET_ELEM_TIMEOUT)
		b = endAttr(binary.BigEndian.AppendUint64(b, uint64(e.Timeout.Milliseconds())), at)
	}
	switch {
	case e.VerdictData != nil:
		data := len(b)
		b = appendAttrHeader(b, unix.NFTA_SET_ELEM_DATA|unix.NLA_F_NESTED)
		verdict := len(b)
		b = appendAttrHeader(b, unix.NFTA_DATA_VERDICT|unix.NLA_F_NESTED)
		b = appendU32Attr(b, unix.NFTA_VERDICT_CODE, uint32(e.VerdictData.Kind))
		if e.VerdictData.Chain != "" {
			b = appendStrAttr(b, unix.NFTA_VERDICT_CHAIN, e.VerdictData.Chain)
		}
		endNested(b, verdict)
		endNested(b, data)
	case len(e.Val) > 0:
		data := len(b)
		b = appendAttrHeader(b, unix.NFTA_SET_ELEM_DATA|unix.NLA_F_NESTED)
		b = appendAttr(b, unix.NFTA_DATA_VALUE, e.Val)
		endNested(b, data)
	}
	if e.Comment != "" {
		ud := len(b)
		b = appendAttrHeader(b, unix.NFTA_SET_ELEM_USERDATA)
		// userdata's TLV: type, length, the comment with its NUL
		// (userdata.AppendString, without its copy of the string).
		b = append(b, byte(userdata.NFTNL_UDATA_SET_ELEM_COMMENT), byte(len(e.Comment)+1))
		b = append(append(b, e.Comment...), 0)
		b = endAttr(b, ud)
	}
	endNested(b, elem)
	return b
}

// appendAttrHeader appends an attribute header whose length endNested or
// endAttr fills in once its payload is appended.
func appendAttrHeader(b []byte, typ uint16) []byte {
	return binary.NativeEndian.AppendUint16(binary.NativeEndian.AppendUint16(b, 0), typ)
}

// endAttr sets the length of the attribute that starts at at, and pads
// its payload to the alignment.
func endAttr(b []byte, at int) []byte {
	binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at))
	for len(b)%unix.NLA_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

// endNested ends a nested attribute: its members are aligned already.
func endNested(b []byte, at int) { binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at)) }

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	at := len(b)
	b = appendAttrHeader(b, typ)
	return endAttr(append(b, data...), at)
}

func appendStrAttr(b []byte, typ uint16, s string) []byte {
	at := len(b)
	b = appendAttrHeader(b, typ)
	b = append(append(b, s...), 0)
	return endAttr(b, at)
}

func appendU32Attr(b []byte, typ uint16, v uint32) []byte {
	at := len(b)
	b = appendAttrHeader(b, typ)
	return endAttr(binary.BigEndian.AppendUint32(b, v), at)
}
