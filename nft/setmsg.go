package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// setMessage encodes the NEWSET message that creates s, with n elements
// when s is constant: attribute for attribute what google/nftables' AddSet
// encodes (setmsg_test.go compares them), but with the user data u, which
// the library cannot be given (it writes a byte order at most; typeof.go).
// It encodes what onehop's sets use: flags, key and data types, a timeout
// and, for concatenations, the length of each field.
func setMessage(s *nftables.Set, n int, u udata) (netlink.Message, error) {
	be32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	var flags uint32
	for _, f := range []struct {
		on  bool
		bit uint32
	}{
		{s.Anonymous, unix.NFT_SET_ANONYMOUS}, {s.Constant, unix.NFT_SET_CONSTANT}, {s.Interval, unix.NFT_SET_INTERVAL},
		{s.IsMap, unix.NFT_SET_MAP}, {s.HasTimeout, unix.NFT_SET_TIMEOUT}, {s.Dynamic, unix.NFT_SET_EVAL},
		{s.Concatenation, nftables.NFT_SET_CONCAT},
	} {
		if f.on {
			flags |= f.bit
		}
	}
	attrs := []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(s.Table.Name + "\x00")},
		{Type: unix.NFTA_SET_NAME, Data: []byte(s.Name + "\x00")},
		{Type: unix.NFTA_SET_FLAGS, Data: be32(flags)},
		{Type: unix.NFTA_SET_KEY_TYPE, Data: be32(s.KeyType.GetNFTMagic())},
		{Type: unix.NFTA_SET_KEY_LEN, Data: be32(s.KeyType.Bytes)},
		{Type: unix.NFTA_SET_ID, Data: be32(s.ID)},
	}
	if s.IsMap {
		dt := s.DataType.GetNFTMagic()
		if isVerdictType(s.DataType) {
			dt = nftVerdictType
		}
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_DATA_TYPE, Data: be32(dt)},
			netlink.Attribute{Type: unix.NFTA_SET_DATA_LEN, Data: be32(s.DataType.Bytes)})
	}
	if s.HasTimeout && s.Timeout != 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_TIMEOUT, Data: binary.BigEndian.AppendUint64(nil, uint64(s.Timeout.Milliseconds()))})
	}
	var err error
	marshal := func(as ...netlink.Attribute) []byte {
		b, e := netlink.MarshalAttributes(as)
		if err == nil {
			err = e
		}
		return b
	}
	if s.Constant {
		// The number of elements, as nft declares it for a constant set.
		attrs = append(attrs, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_DESC,
			Data: marshal(netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: be32(uint32(n))})})
	}
	if s.Concatenation {
		var fields []netlink.Attribute
		for _, f := range nftables.ConcatSetTypeElements(s.KeyType) {
			fields = append(fields, netlink.Attribute{Type: unix.NFTA_SET_DESC_SIZE,
				Data: marshal(netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: be32(f.Bytes)})})
		}
		concat := netlink.Attribute{Type: unix.NLA_F_NESTED | nftables.NFTA_SET_DESC_CONCAT, Data: marshal(fields...)}
		attrs = append(attrs, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_DESC, Data: marshal(concat)})
	}
	if len(u) > 0 {
		attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_SET_USERDATA, Data: u})
	}
	b := marshal(attrs...)
	if err != nil {
		return netlink.Message{}, fmt.Errorf("set %s: %w", s.Name, err)
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSET),
			Flags: netlink.Request | netlink.Acknowledge | netlink.Create,
		},
		Data: append([]byte{byte(s.Table.Family), unix.NFNETLINK_V0, 0, 0}, b...),
	}, nil
}
