package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// setDecl is a set or map as the kernel declares it.
type setDecl struct {
	name     string
	id       uint32
	flags    uint32 // NFT_SET_*
	keyType  uint32 // nft datatype, concatenations 6 bits per field
	keyLen   uint32
	dataType uint32 // nftVerdictType for verdict maps
	dataLen  uint32
	timeout  time.Duration
	size     uint32
	// udata is the set's user data; key and data what it says of their
	// types (typeof.go).
	udata     []byte
	key, data setTypeof
}

// nftVerdictType is the data type of verdict maps on the wire.
const nftVerdictType = 0xffffff00

func (s *setDecl) isMap() bool { return s.flags&unix.NFT_SET_MAP != 0 }

// anonymous sets belong to one rule and are printed inside it.
func (s *setDecl) anonymous() bool { return s.flags&unix.NFT_SET_ANONYMOUS != 0 }

// listSets reads the declarations of the table's sets. It asks the kernel
// directly: github.com/google/nftables loses the key type of verdict maps.
func listSets(netnsFD int, t *nftables.Table) ([]*setDecl, error) {
	ns := 0
	if netnsFD >= 0 {
		ns = netnsFD
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns})
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer c.Close()
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_SET_TABLE, Data: []byte(t.Name + "\x00")}})
	if err != nil {
		return nil, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSET),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(t.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	var sets []*setDecl
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		s, table, err := decodeSetDecl(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("list sets: %w", err)
		}
		if table == t.Name {
			sets = append(sets, s)
		}
	}
	return sets, nil
}

func decodeSetDecl(b []byte) (*setDecl, string, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, "", err
	}
	ad.ByteOrder = binary.BigEndian
	s, table := &setDecl{}, ""
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_TABLE:
			table = ad.String()
		case unix.NFTA_SET_NAME:
			s.name = ad.String()
		case unix.NFTA_SET_ID:
			s.id = ad.Uint32()
		case unix.NFTA_SET_FLAGS:
			s.flags = ad.Uint32()
		case unix.NFTA_SET_KEY_TYPE:
			s.keyType = ad.Uint32()
		case unix.NFTA_SET_KEY_LEN:
			s.keyLen = ad.Uint32()
		case unix.NFTA_SET_DATA_TYPE:
			s.dataType = ad.Uint32()
		case unix.NFTA_SET_DATA_LEN:
			s.dataLen = ad.Uint32()
		case unix.NFTA_SET_USERDATA:
			s.udata = ad.Bytes()
		case unix.NFTA_SET_TIMEOUT:
			s.timeout = time.Duration(ad.Uint64()) * time.Millisecond
		case unix.NFTA_SET_DESC:
			ad.Nested(func(nd *netlink.AttributeDecoder) error {
				for nd.Next() {
					if nd.Type() == unix.NFTA_SET_DESC_SIZE {
						s.size = nd.Uint32()
					}
				}
				return nil
			})
		}
	}
	s.key, s.data = parseSetUdata(s.udata)
	return s, table, ad.Err()
}

// declText is the line that declares a set's types: typeof and the
// expressions, when its user data holds them, else type and the types.
func (s *setDecl) declText() string {
	if s.key.text != "" {
		text := "typeof " + s.key.text
		switch {
		case s.isMap() && s.data.text != "":
			text += " : " + s.data.text
		case s.isMap():
			text += " : " + typeName(s.dataFields(), s.dataLen)
		}
		return text
	}
	text := "type " + typeName(s.keyFields(), s.keyLen)
	if s.isMap() {
		text += " : " + typeName(s.dataFields(), s.dataLen)
	}
	return text
}

// keyFields are the datatypes of the fields of the set's keys: its
// typeof's or its key type's, integers in host byte order when the user
// data says so.
func (s *setDecl) keyFields() []uint32 { return s.key.fieldsOf(s.keyType) }

func (s *setDecl) dataFields() []uint32 { return s.data.fieldsOf(s.dataType) }

func (t setTypeof) fieldsOf(magic uint32) []uint32 {
	if t.fields != nil {
		return t.fields
	}
	f := typeFields(magic)
	for i := range f {
		if t.host && f[i] == dtInteger {
			f[i] = dtHostInteger
		}
	}
	return f
}

// keyText prints a key of the set.
func (s *setDecl) keyText(b []byte) string { return valueText(s.keyFields(), b) }

// sortElems sorts elements by key as nft orders values: each field by its
// value, integers in host byte order too.
func (s *setDecl) sortElems(els []nftables.SetElement) []nftables.SetElement {
	fields := s.keyFields()
	if !slices.Contains(fields, dtHostInteger) {
		slices.SortFunc(els, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
		return els
	}
	// Each key with its host-order integers in big-endian order.
	type sortable struct {
		key []byte
		el  nftables.SetElement
	}
	byKey := make([]sortable, len(els))
	for i, el := range els {
		k := slices.Clone(el.Key)
		for f, off := 0, 0; f < len(fields) && off+4 <= len(k); f++ {
			if fields[f] == dtHostInteger {
				binary.BigEndian.PutUint32(k[off:], binary.NativeEndian.Uint32(el.Key[off:]))
			}
			off += (max(4, fieldLen(fields[f])) + 3) / 4 * 4
		}
		byKey[i] = sortable{k, el}
	}
	slices.SortFunc(byKey, func(a, b sortable) int { return bytes.Compare(a.key, b.key) })
	for i := range byKey {
		els[i] = byKey[i].el
	}
	return els
}
