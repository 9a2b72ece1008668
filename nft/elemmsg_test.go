package nft

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
)

// libraryMessages are the messages google/nftables builds for what build
// queues.
func libraryMessages(t *testing.T, build func(c *nftables.Conn) error) []netlink.Message {
	t.Helper()
	var got []netlink.Message
	var pending []netlink.Message
	c, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil {
			if len(pending) == 0 {
				return nil, nil
			}
			m := pending[0]
			pending = pending[1:]
			return []netlink.Message{m}, nil
		}
		for _, m := range req {
			if !isBatchMarker(m) {
				got = append(got, m)
				pending = append(pending, ackFor(m, 0))
			}
		}
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := build(c); err != nil {
		t.Fatalf("library: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("library: %v", err)
	}
	return got
}

// libraryMessage is the message google/nftables builds for els.
func libraryMessage(t *testing.T, set *nftables.Set, els []nftables.SetElement, add bool) netlink.Message {
	t.Helper()
	got := libraryMessages(t, func(c *nftables.Conn) error {
		if add {
			return c.SetAddElements(set, els)
		}
		return c.SetDeleteElements(set, els)
	})
	if len(got) != 1 {
		t.Fatalf("library: %d messages", len(got))
	}
	return got[0]
}

// elemMessage encodes what google/nftables encodes, byte for byte, for
// every kind of element onehop writes: verdicts (goto and jump, with and
// without a comment), values, bare keys, and deletions; keys and
// comments of odd lengths test the padding.
func TestElemMessageMatchesLibrary(t *testing.T) {
	table := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	set := &nftables.Set{Table: table, Name: "service-ips-v4", ID: 7}
	for _, tc := range []struct {
		name string
		els  []nftables.SetElement
		add  bool
	}{
		{"verdicts", []nftables.SetElement{
			{Key: []byte{10, 96, 0, 1, 0, 6, 0, 80}, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "svc-4-tcp-1a"}, Comment: "default/web:http"},
			{Key: []byte{10, 96, 0, 2, 0, 17}, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: "ext-4-udp-abc"}},
			{Key: []byte{1, 2, 3}, VerdictData: &expr.Verdict{Kind: expr.VerdictDrop}, Comment: "x"},
		}, true},
		{"values", []nftables.SetElement{
			{Key: []byte{0, 0, 0, 9, 0, 0, 0, 1}, Val: []byte{10, 244, 1, 2, 0x1f, 0x90}},
			{Key: []byte{192, 0, 2, 1}, Val: []byte{10, 0, 0, 1}, Comment: "pod default/p"},
		}, true},
		{"keys", []nftables.SetElement{{Key: []byte{192, 0, 2, 1}}, {Key: []byte{0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}}}, true},
		{"deletes", []nftables.SetElement{{Key: []byte{10, 96, 0, 1, 0, 6, 0, 80}}, {Key: []byte{7}}}, false},
		{"intervals", []nftables.SetElement{
			{Key: []byte{192, 0, 2, 0}}, {Key: []byte{192, 0, 3, 0}, IntervalEnd: true},
			{Key: []byte{198, 51, 100, 0}, KeyEnd: []byte{198, 51, 100, 255}},
		}, true},
		{"timeouts", []nftables.SetElement{{Key: []byte{10, 0, 0, 1}, Timeout: 3 * time.Hour}}, true},
	} {
		set := set
		if tc.name == "timeouts" {
			set = &nftables.Set{Table: table, Name: "aff-1", ID: 9, HasTimeout: true}
		}
		want := libraryMessage(t, set, tc.els, tc.add)
		got := elemMessage(set, tc.els, tc.add)
		if got.Header.Type != want.Header.Type || got.Header.Flags != want.Header.Flags {
			t.Errorf("%s: header %+v, library's %+v", tc.name, got.Header, want.Header)
		}
		if !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s: data\n%x\nlibrary's\n%x", tc.name, got.Data, want.Data)
		}
		if cap(got.Data) != len(got.Data) {
			t.Errorf("%s: buffer of %d bytes for %d: elemLen is off", tc.name, cap(got.Data), len(got.Data))
		}
	}
}
