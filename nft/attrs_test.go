package nft

import (
	"bytes"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// elementsMessage encodes a NEWSETELEM payload as the kernel sends one: an
// element with a data value and one with a verdict and a comment.
func elementsMessage(t *testing.T) []byte {
	t.Helper()
	nested := func(attrs ...netlink.Attribute) []byte {
		b, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	be32 := func(v uint32) []byte { return []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }
	gotoCode := int32(expr.VerdictGoto)
	data := netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_DATA,
		Data: nested(netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: []byte{10, 244, 0, 2, 0x1f, 0x90, 0, 0}})}
	verdict := netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_DATA,
		Data: nested(netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_DATA_VERDICT, Data: nested(
			netlink.Attribute{Type: unix.NFTA_VERDICT_CODE, Data: be32(uint32(gotoCode))},
			netlink.Attribute{Type: unix.NFTA_VERDICT_CHAIN, Data: []byte("svc4/demo/web/tcp/http\x00")},
		)})}
	key := func(k ...byte) netlink.Attribute {
		return netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: nested(netlink.Attribute{Type: unix.NFTA_DATA_VALUE, Data: k})}
	}
	comment := userdata.AppendString(nil, userdata.NFTNL_UDATA_SET_ELEM_COMMENT, "cluster-ip svc4/demo/web/tcp/http")
	list := nested(
		netlink.Attribute{Type: unix.NLA_F_NESTED | 1, Data: nested(key(0, 0, 0, 2, 1, 0, 0, 0), data)},
		netlink.Attribute{Type: unix.NLA_F_NESTED | 2, Data: nested(key(10, 96, 0, 10),
			netlink.Attribute{Type: unix.NFTA_SET_ELEM_FLAGS, Data: be32(0)},
			netlink.Attribute{Type: unix.NFTA_SET_ELEM_USERDATA, Data: comment}, verdict)},
	)
	return nested(
		netlink.Attribute{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte("onehop\x00")},
		netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: list},
	)
}

func TestDecodeElements(t *testing.T) {
	els, err := decodeElements(nil, elementsMessage(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(els) != 2 {
		t.Fatalf("got %d elements, want 2", len(els))
	}
	if e := els[0]; !bytes.Equal(e.Key, []byte{0, 0, 0, 2, 1, 0, 0, 0}) || !bytes.Equal(e.Val, []byte{10, 244, 0, 2, 0x1f, 0x90, 0, 0}) || e.VerdictData != nil {
		t.Errorf("endpoint element: %+v", e)
	}
	e := els[1]
	if !bytes.Equal(e.Key, []byte{10, 96, 0, 10}) || e.Comment != "cluster-ip svc4/demo/web/tcp/http" {
		t.Errorf("verdict element: key %v comment %q", e.Key, e.Comment)
	}
	if v := e.VerdictData; v == nil || v.Kind != expr.VerdictGoto || v.Chain != "svc4/demo/web/tcp/http" {
		t.Errorf("verdict element's verdict: %+v", v)
	}
}

// A message cut anywhere is an error or fewer elements, never a panic or
// an element read past the end.
func TestDecodeElementsTruncated(t *testing.T) {
	msg := elementsMessage(t)
	for n := range len(msg) {
		cut := bytes.Clone(msg[:n])
		els, err := decodeElements(nil, cut, nil)
		if err == nil && len(els) == 2 && n < len(msg)-4 {
			t.Errorf("cut at %d of %d: decoded both elements without an error", n, len(msg))
		}
	}
}
