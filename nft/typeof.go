package nft

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// A set's datatype (NFTA_SET_KEY_TYPE) says how nft prints its keys only
// for types of a fixed size and byte order: an integer has neither, and
// nft cannot print a concatenation of integers at all. What nft itself
// declares `typeof <expression>` it keeps in the set's user data
// (NFTA_SET_USERDATA: type-length-value records, libnftnl's
// NFTNL_UDATA_SET_*), and prints the keys as the expressions' values.
// This file writes that user data as nft 1.0.6 writes it, for the sets
// whose keys need it, and reads it back for the rendering (text.go):
//
//	endpoint maps:   typeof numgen random mod 1 . numgen random mod 1 : ip daddr . th dport
//	                 (the chain id and the index, integers in host byte order)
//	numgen vmaps:    the key's byte order (host), so that index 1 prints as 1
//
// Every other set carries what github.com/google/nftables writes for it.

// Records of a set's user data, and of a typeof declaration in it.
const (
	udataTypeofExpr = 0 // NFTNL_UDATA_SET_TYPEOF_EXPR: the expression type
	udataTypeofData = 1 // NFTNL_UDATA_SET_TYPEOF_DATA: the expression, nested
	// NFTNL_UDATA_SET_KEY_CONCAT_SUB_*: a concatenation holds one nested
	// record per field, numbered from 0, each an expression type and data.
	udataConcatSubType = 0
	udataConcatSubData = 1
	// The fields of numgen and payload expressions.
	udataNumgenType    = 0
	udataNumgenMod     = 1
	udataNumgenOffset  = 2
	udataMetaKey       = 0
	udataPayloadDesc   = 0
	udataPayloadType   = 1
	udataDataInterval  = 6 // NFTNL_UDATA_SET_DATA_INTERVAL
	byteOrderInvalid   = 0 // nft's enum byteorder
	byteOrderHost      = 1
	byteOrderBigEndian = 2
)

// nft's expression types (enum expr_types) as its user data numbers them.
const (
	exprVerdict = 1
	exprPayload = 7
	exprMeta    = 9
	exprConcat  = 13
	exprNumgen  = 23
)

// nft's protocol descriptions (enum proto_desc_id) and their header fields.
const (
	protoDescTH  = 11 // th: THDR_SPORT 1, THDR_DPORT 2
	protoDescIP  = 12 // ip: IPHDR_SADDR 11, IPHDR_DADDR 12
	protoDescIP6 = 13 // ip6: IP6HDR_SADDR 8, IP6HDR_DADDR 9
)

// payloadFields names the header fields a typeof may hold, with their datatype.
var payloadFields = map[[2]uint32]struct {
	name string
	dt   uint32
}{
	{protoDescIP, 11}: {"ip saddr", dtIPv4}, {protoDescIP, 12}: {"ip daddr", dtIPv4},
	{protoDescIP6, 8}: {"ip6 saddr", dtIPv6}, {protoDescIP6, 9}: {"ip6 daddr", dtIPv6},
	{protoDescTH, 1}: {"th sport", dtInetService}, {protoDescTH, 2}: {"th dport", dtInetService},
}

// udata builds user data records: a byte of type, a byte of length, the
// value; numbers as 4 bytes in host byte order (nftnl_udata_put_u32).
type udata []byte

func (u udata) u32(typ byte, v uint32) udata {
	return binary.NativeEndian.AppendUint32(append(u, typ, 4), v)
}

func (u udata) nest(typ byte, inner udata) udata {
	if len(inner) > 255 {
		panic("set user data record over 255 bytes")
	}
	return append(append(u, typ, byte(len(inner))), inner...)
}

// typeofExpr is one expression of a typeof declaration: its type and its
// own records.
type typeofExpr struct {
	etype uint32
	data  udata
}

func (e typeofExpr) records() udata {
	return udata(nil).u32(udataTypeofExpr, e.etype).nest(udataTypeofData, e.data)
}

func typeofNumgenRandom(mod uint32) typeofExpr {
	return typeofExpr{exprNumgen, udata(nil).u32(udataNumgenType, unix.NFT_NG_RANDOM).u32(udataNumgenMod, mod).u32(udataNumgenOffset, 0)}
}

func typeofMeta(key uint32) typeofExpr {
	return typeofExpr{exprMeta, udata(nil).u32(udataMetaKey, key)}
}

func typeofPayload(desc, field uint32) typeofExpr {
	return typeofExpr{exprPayload, udata(nil).u32(udataPayloadDesc, desc).u32(udataPayloadType, field)}
}

func typeofConcat(fields ...typeofExpr) typeofExpr {
	var d udata
	for i, f := range fields {
		d = d.nest(byte(i), udata(nil).u32(udataConcatSubType, f.etype).nest(udataConcatSubData, f.data))
	}
	return typeofExpr{exprConcat, d}
}

// endpointMapUdata is the user data of the endpoint maps of family f:
// typeof numgen random mod 1 . numgen random mod 1 : ip[6] daddr . th dport.
func endpointMapUdata(f nftables.SetDatatype) udata {
	addr := typeofPayload(protoDescIP, 12)
	if f.GetNFTMagic() == nftables.TypeIP6Addr.GetNFTMagic() {
		addr = typeofPayload(protoDescIP6, 9)
	}
	return udata(nil).
		u32(byte(userdata.NFTNL_UDATA_SET_KEYBYTEORDER), byteOrderInvalid).
		u32(byte(userdata.NFTNL_UDATA_SET_DATABYTEORDER), byteOrderInvalid).
		nest(byte(userdata.NFTNL_UDATA_SET_KEY_TYPEOF), typeofConcat(typeofNumgenRandom(1), typeofNumgenRandom(1)).records()).
		nest(byte(userdata.NFTNL_UDATA_SET_DATA_TYPEOF), typeofConcat(addr, typeofPayload(protoDescTH, 2)).records()).
		u32(udataDataInterval, 0)
}

// numgenVmapUdata is the user data of a verdict map keyed by numgen: the
// key in host byte order, the data a verdict.
func numgenVmapUdata() udata {
	return udata(nil).
		u32(byte(userdata.NFTNL_UDATA_SET_KEYBYTEORDER), byteOrderHost).
		u32(byte(userdata.NFTNL_UDATA_SET_DATABYTEORDER), byteOrderInvalid).
		nest(byte(userdata.NFTNL_UDATA_SET_DATA_TYPEOF), typeofExpr{exprVerdict, nil}.records()).
		u32(udataDataInterval, 0)
}

// Key types of the sets that carry a typeof.
var (
	endpointKeyType = nftables.MustConcatSetType(nftables.TypeInteger, nftables.TypeInteger)
	isVerdictType   = func(t nftables.SetDatatype) bool { return t.GetNFTMagic() == nftables.TypeVerdict.GetNFTMagic() }
)

// setUserData is the user data a set of s's types is created with: a
// typeof for the endpoint maps, the key's byte order for a numgen verdict
// map, and for every other set what github.com/google/nftables writes.
func setUserData(s *nftables.Set) udata {
	switch {
	case isFlatKeyType(s):
		return flatMapUdata(s)
	case s.KeyType.Name == endpointKeyType.Name && s.IsMap && !isVerdictType(s.DataType):
		return endpointMapUdata(nftables.ConcatSetTypeElements(s.DataType)[0])
	case s.Anonymous && s.KeyType.Name == nftables.TypeInteger.Name && s.IsMap && isVerdictType(s.DataType):
		return numgenVmapUdata()
	}
	var u udata
	if s.Anonymous || s.Constant || s.Interval {
		u = u.u32(byte(userdata.NFTNL_UDATA_SET_KEYBYTEORDER), byteOrderBigEndian)
	}
	return u
}

// setTypeof is what a set's user data says of its key or data.
type setTypeof struct {
	text   string   // the typeof expression, "" when there is none
	fields []uint32 // the datatype of each field, nil when there is no typeof
	host   bool     // a byte order record says host byte order
}

// parseSetUdata reads the typeof of a set's key and data and the key's
// byte order from its user data. A typeof it cannot read is left out.
func parseSetUdata(u []byte) (key, data setTypeof) {
	for typ, v := range udataRecords(u) {
		switch userdata.Type(typ) {
		case userdata.NFTNL_UDATA_SET_KEYBYTEORDER:
			key.host = len(v) == 4 && binary.NativeEndian.Uint32(v) == byteOrderHost
		case userdata.NFTNL_UDATA_SET_DATABYTEORDER:
			data.host = len(v) == 4 && binary.NativeEndian.Uint32(v) == byteOrderHost
		case userdata.NFTNL_UDATA_SET_KEY_TYPEOF:
			key.text, key.fields = parseTypeof(v)
		case userdata.NFTNL_UDATA_SET_DATA_TYPEOF:
			data.text, data.fields = parseTypeof(v)
		}
	}
	return key, data
}

// udataRecords yields the records of u, type and value, up to the first
// that does not fit.
func udataRecords(u []byte) func(yield func(byte, []byte) bool) {
	return func(yield func(byte, []byte) bool) {
		for len(u) >= 2 && len(u) >= 2+int(u[1]) {
			if !yield(u[0], u[2:2+int(u[1])]) {
				return
			}
			u = u[2+int(u[1]):]
		}
	}
}

// udataU32s returns the 4-byte records of u by type.
func udataU32s(u []byte) map[byte]uint32 {
	out := map[byte]uint32{}
	for typ, v := range udataRecords(u) {
		if len(v) == 4 {
			out[typ] = binary.NativeEndian.Uint32(v)
		}
	}
	return out
}

// parseTypeof reads a typeof declaration: its expression, in nft syntax,
// and the datatype of each of its fields; "" and nil when it holds an
// expression this rendering does not know.
func parseTypeof(u []byte) (string, []uint32) {
	var etype uint32
	var data []byte
	found := false
	for typ, v := range udataRecords(u) {
		switch typ {
		case udataTypeofExpr:
			if len(v) == 4 {
				etype, found = binary.NativeEndian.Uint32(v), true
			}
		case udataTypeofData:
			data = v
		}
	}
	if !found {
		return "", nil
	}
	if etype != exprConcat {
		return typeofText(etype, data)
	}
	var texts []string
	var fields []uint32
	for _, sub := range udataRecords(data) {
		t, f := parseTypeof(sub) // a field: an expression type and its data
		if t == "" {
			return "", nil
		}
		texts, fields = append(texts, t), append(fields, f...)
	}
	return strings.Join(texts, " . "), fields
}

// typeofText prints one expression of a typeof.
func typeofText(etype uint32, data []byte) (string, []uint32) {
	v := udataU32s(data)
	switch etype {
	case exprVerdict:
		return "verdict", []uint32{dtVerdict}
	case exprNumgen:
		kind := map[uint32]string{unix.NFT_NG_INCREMENTAL: "inc", unix.NFT_NG_RANDOM: "random"}[v[udataNumgenType]]
		if kind == "" {
			return "", nil
		}
		text := fmt.Sprintf("numgen %s mod %d", kind, v[udataNumgenMod])
		if off := v[udataNumgenOffset]; off != 0 {
			text += fmt.Sprintf(" offset %d", off)
		}
		return text, []uint32{dtHostInteger}
	case exprMeta:
		if v[udataMetaKey] == unix.NFT_META_L4PROTO {
			return "meta l4proto", []uint32{dtInetProto}
		}
	case exprPayload:
		if f, ok := payloadFields[[2]uint32{v[udataPayloadDesc], v[udataPayloadType]}]; ok {
			return f.name, []uint32{f.dt}
		}
	}
	return "", nil
}
