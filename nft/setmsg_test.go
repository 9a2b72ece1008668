package nft

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// setMessage encodes what google/nftables' AddSet encodes for every set
// onehop creates (the fixed sets and maps, a set of source ranges, an
// affinity set with its timeout, a constant verdict map), attribute for
// attribute, but the user data: the library's when the set needs no more,
// the typeof or byte order nft declares otherwise.
func TestSetMessageMatchesLibrary(t *testing.T) {
	table := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	b := New(dataplane.Config{})
	sets := fixedSets(table)
	sets = append(sets,
		b.rangeSetObj("sr4/demo/web", portal.IPv4),
		&nftables.Set{Table: table, Name: "aff6/demo/web/tcp/http@[fd00::1]:80", HasTimeout: true, Dynamic: true,
			Timeout: 3 * time.Hour, KeyType: addrType(portal.IPv6)},
		&nftables.Set{Table: table, Name: "__map%d", Anonymous: true, Constant: true, IsMap: true,
			KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict})
	els := []nftables.SetElement{
		{Key: numgenKey(0), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "aep4/demo/web/tcp/http@10.244.1.2:8080"}},
		{Key: numgenKey(1), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "aep4/demo/web/tcp/http@10.244.2.2:8080"}},
	}
	typed := 0
	for i, s := range sets {
		s.ID = uint32(i + 1)
		var n int
		if s.Constant {
			n = len(els)
		}
		lib := libraryMessages(t, func(c *nftables.Conn) error { return c.AddSet(s, els[:n]) })
		got, err := setMessage(s, n, setUserData(s))
		if err != nil {
			t.Fatal(err)
		}
		want, wantU := withoutUserData(t, lib[0])
		have, haveU := withoutUserData(t, got)
		if got.Header.Type != lib[0].Header.Type || got.Header.Flags != lib[0].Header.Flags || !bytes.Equal(have, want) {
			t.Errorf("set %s: header %+v, attributes\n%x\nwant %+v,\n%x", s.Name, got.Header, have, lib[0].Header, want)
		}
		if !bytes.Equal(haveU, wantU) {
			typed++
			if !bytes.Equal(haveU, setUserData(s)) {
				t.Errorf("set %s: user data %x, want %x", s.Name, haveU, setUserData(s))
			}
		}
	}
	// The endpoint and flat maps, typeof; the verdict map, its key's
	// byte order.
	if want := 2*endpointShards + 2*2*maxFlat + 1; typed != want {
		t.Errorf("%d sets declare more than the library would, want %d", typed, want)
	}
}

// withoutUserData returns a NEWSET message's attributes but its user data,
// and the user data.
func withoutUserData(t *testing.T, m netlink.Message) (attrs, udata []byte) {
	t.Helper()
	as, err := netlink.UnmarshalAttributes(m.Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	var keep []netlink.Attribute
	for _, a := range as {
		if a.Type == unix.NFTA_SET_USERDATA {
			udata = a.Data
			continue
		}
		keep = append(keep, a)
	}
	attrs, err = netlink.MarshalAttributes(keep)
	if err != nil {
		t.Fatal(err)
	}
	return append(bytes.Clone(m.Data[:4]), attrs...), udata
}

// The user data of the endpoint maps and of a numgen verdict map is what
// nft writes for the same declarations, read back from the kernel, and
// reads back as those declarations.
func TestSetUserDataIsNfts(t *testing.T) {
	requireNft(t)
	ns := nsutil.New(t, "udata")
	const script = `table inet t {
	map e4 { typeof numgen random mod 1 . numgen random mod 1 : ip daddr . th dport; }
	map e6 { typeof numgen random mod 1 . numgen random mod 1 : ip6 daddr . th dport; }
	chain c {
		numgen random mod 2 vmap { 0 : drop, 1 : accept }
	}
}`
	cmd := ns.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
	sets, err := listSets(ns.FD(), &nftables.Table{Name: "t", Family: nftables.TableFamilyINet})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]udata{
		"e4": setUserData(&nftables.Set{IsMap: true, KeyType: endpointKeyType,
			DataType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)}),
		"e6": setUserData(&nftables.Set{IsMap: true, KeyType: endpointKeyType,
			DataType: nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetService)}),
		"vmap": setUserData(&nftables.Set{Anonymous: true, Constant: true, IsMap: true,
			KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}),
	}
	for _, s := range sets {
		name := s.name
		if s.anonymous() {
			name = "vmap"
		}
		if !bytes.Equal(s.udata, want[name]) {
			t.Errorf("%s: nft writes user data\n%x\nonehop\n%x", name, s.udata, want[name])
		}
		delete(want, name)
		if name == "e4" && (s.key.text != "numgen random mod 1 . numgen random mod 1" || s.data.text != "ip daddr . th dport") {
			t.Errorf("read back as typeof %q : %q", s.key.text, s.data.text)
		}
	}
	if len(want) > 0 {
		t.Errorf("sets not found: %v", want)
	}
}
