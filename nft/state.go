package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A full sync reconciles the table in place: it reads what the kernel
// holds and sends only the difference, so that a restart or a periodic
// full sync keeps every affinity entry and counter and never leaves a
// moment in which a Service is missing. To know whether a chain already
// holds the rules it should, each rule carries a tag in its user data:
// the version of the rule layout and a hash of everything the chain's
// rules are made from, and for a chain that picks from an endpoint map, the
// chain's id (the first half of its endpoint-map keys), so that a new
// process keeps the ids, and with them the endpoint maps, as they are.

// layoutVersion changes whenever the rules rendered from the same input
// change, so that a new version rewrites the chains of an older one.
const layoutVersion = "onehop5"

// ruleTag is the user data of a chain's rules: the layout, the chain's id
// and a hash (FNV-1a, 64 bits) of what its rules are made from.
func ruleTag[T string | []byte](id uint32, content T) []byte {
	// hash/fnv's New64a, written out: through its interface content would
	// leave the caller's stack.
	h := uint64(14695981039346656037)
	for i := 0; i < len(content); i++ {
		h ^= uint64(content[i])
		h *= 1099511628211
	}
	return fmt.Appendf(nil, "%s %d %016x", layoutVersion, id, h)
}

// parseTag returns the chain id in a rule tag written by this layout
// version.
func parseTag(tag []byte) (uint32, bool) {
	f := strings.Fields(string(tag))
	if len(f) != 3 || f[0] != layoutVersion {
		return 0, false
	}
	id, err := strconv.ParseUint(f[1], 10, 32)
	return uint32(id), err == nil
}

// bodyTag is the tag of a per-portal chain with id holding body: ruleTag
// of body's fields and cfgKey, written out by hand (a full sync tags 10k
// chains; fmt's reflection was a sixth of its time, and its %+v printed
// netip.Addr's internals, a pointer among them). The bytes are pinned by
// TestBodyTagIsPinned: a change rewrites every chain on upgrade.
func (b *Backend) bodyTag(id uint32, body chainBody) []byte {
	var arr [512]byte
	buf := append(arr[:0], "{family:"...)
	buf = append(buf, body.family.String()...)
	buf = append(buf, " shortCircuit:"...)
	buf = append(buf, body.shortCircuit...)
	buf = append(buf, " endpoints:["...)
	for i, ep := range body.endpoints {
		if i > 0 {
			buf = append(buf, ' ')
		}
		buf = ep.AppendTo(buf)
	}
	buf = append(buf, "] affinity:"...)
	buf = strconv.AppendUint(buf, uint64(body.affinity), 10)
	buf = append(buf, " dropIfEmpty:"...)
	buf = strconv.AppendBool(buf, body.dropIfEmpty)
	buf = append(buf, "}|"...)
	buf = append(buf, b.cfgKey()...)
	if len(body.endpoints) == 1 && body.usesEndpointMap() {
		// Its rule once held the endpoint itself: a kernel with that rule
		// must not pass for this one.
		buf = append(buf, "|map"...)
	}
	return ruleTag(id, buf)
}

// cfgKey is what of the configuration the rules are made from (the
// configuration does not change: New formats it once).
func (b *Backend) cfgKey() string { return b.cfgKeyText }

func (b *Backend) formatCfgKey() string {
	return fmt.Sprintf("%v|%v|%v|%d|%v", b.cfg.ClusterCIDRs, b.cfg.ServiceCIDRs, b.cfg.MasqueradeAll, b.cfg.MasqueradeMark(), b.cfg.SourceRangesOnNodePorts)
}

// fixedTag is the tag of the rules of the fixed chains.
func (b *Backend) fixedTag(chain string) []byte { return ruleTag(0, chain+"|"+b.cfgKey()) }

// kernelState is what a full sync needs to know of the table the kernel
// holds.
type kernelState struct {
	chains map[string]bool
	// tags holds the tag of each chain's first rule, and rules the
	// number of rules per chain.
	tags  map[string][]byte
	rules map[string]int
	sets  map[string]*setDecl
	// elems holds the elements of the fixed sets and of the Services' sets
	// of source ranges (not of the affinity sets, whose clients are kept
	// as they are).
	elems map[string][]nftables.SetElement
}

// readState reads the table for an in-place full sync. It returns nil,
// nil when the table does not exist, and nil with an error when it cannot
// be reconciled in place (a fixed set of another type, left by another
// layout version): the caller then replaces the table as a whole.
func (b *Backend) readState(conn *nftables.Conn) (*kernelState, error) {
	if _, err := conn.ListTableOfFamily(b.table.Name, b.table.Family); err != nil {
		return nil, nil
	}
	k := &kernelState{chains: map[string]bool{}, tags: map[string][]byte{}, rules: map[string]int{},
		sets: map[string]*setDecl{}, elems: map[string][]nftables.SetElement{}}
	chains, err := conn.ListChainsOfTableFamily(b.table.Family)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name == b.table.Name {
			k.chains[c.Name] = true
		}
	}
	if err := b.readRuleTags(k); err != nil {
		return nil, err
	}
	sets, err := listSets(b.netnsFD, b.table)
	if err != nil {
		return nil, err
	}
	for _, s := range sets {
		if !s.anonymous() {
			k.sets[s.name] = s
		}
	}
	d, err := b.newElemDumper()
	if err != nil {
		return nil, err
	}
	defer d.close()
	for _, want := range fixedSets(b.table) {
		have := k.sets[want.Name]
		if have == nil {
			continue // created by the sync
		}
		if have.keyLen != want.KeyType.Bytes || have.isMap() != want.IsMap {
			return nil, fmt.Errorf("set %s has another type than this version uses", want.Name)
		}
		els, err := d.dump(want.Name)
		if err != nil {
			return nil, err
		}
		k.elems[want.Name] = els
	}
	for name, s := range k.sets {
		if !isRangeSet(name) {
			continue
		}
		if err := checkRangeSet(s); err != nil {
			return nil, err
		}
		els, err := d.dump(name)
		if err != nil {
			return nil, err
		}
		k.elems[name] = els
	}
	return k, nil
}

// readRuleTags dumps every rule of the table in one request and keeps, per
// chain, the number of rules and the first one's tag (nftables' GetRules
// asks per chain: one round trip per Service port).
func (b *Backend) readRuleTags(k *kernelState) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: max(b.netnsFD, 0)})
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer c.Close()
	if err := bigBuffers(c); err != nil {
		return err
	}
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_RULE_TABLE, Data: []byte(b.table.Name + "\x00")}})
	if err != nil {
		return err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(b.table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		var table, chain string
		var tag []byte
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_TABLE:
				table = ad.String()
			case unix.NFTA_RULE_CHAIN:
				chain = ad.String()
			case unix.NFTA_RULE_USERDATA:
				tag = bytes.Clone(ad.Bytes())
			}
		}
		if err := ad.Err(); err != nil {
			return fmt.Errorf("list rules: %w", err)
		}
		if table != b.table.Name {
			continue
		}
		if k.rules[chain] == 0 {
			k.tags[chain] = tag
		}
		k.rules[chain]++
	}
	return nil
}

// elemEqual reports whether a wanted element (want) and one read back from
// the kernel (have) map the same key to the same value, with the same
// comment (the way in and portal dump-rules reports: two Services' ways in
// without endpoints share a verdict, goto reject). The library returns a
// verdict map's data undecoded, in Val.
func elemEqual(want, have nftables.SetElement) bool {
	if !bytes.Equal(want.Key, have.Key) || want.Comment != have.Comment {
		return false
	}
	if want.VerdictData == nil {
		return have.VerdictData == nil && bytes.Equal(want.Val, have.Val)
	}
	hv := have.VerdictData
	if hv == nil {
		hv = decodeVerdict(have.Val)
	}
	return hv != nil && hv.Kind == want.VerdictData.Kind && hv.Chain == want.VerdictData.Chain
}

// decodeVerdict decodes the verdict attributes of a map element's data.
func decodeVerdict(b []byte) *expr.Verdict {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil
	}
	ad.ByteOrder = binary.BigEndian
	v := &expr.Verdict{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind = expr.VerdictKind(int32(ad.Uint32()))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	if ad.Err() != nil {
		return nil
	}
	return v
}

// elemDumper reads the elements of named sets, one dump each, over one
// socket and one buffer. It asks for large messages: the kernel resumes a
// set dump by walking the set from its start, so the number of messages
// multiplies the cost of a large set.
type elemDumper struct {
	b   *Backend
	c   *netlink.Conn
	raw syscall.RawConn
	buf []byte
}

func (b *Backend) newElemDumper() (*elemDumper, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: max(b.netnsFD, 0)})
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	if err := bigBuffers(c); err != nil {
		c.Close()
		return nil, err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	// With a large receive buffer the kernel fills 32 KiB per message.
	return &elemDumper{b: b, c: c, raw: raw, buf: make([]byte, 1<<20)}, nil
}

func (d *elemDumper) close() { d.c.Close() }

// dump reads the elements of the named set.
func (d *elemDumper) dump(set string) ([]nftables.SetElement, error) {
	b, raw, buf := d.b, d.raw, d.buf
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(b.table.Name + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
	})
	if err != nil {
		return nil, err
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: append([]byte{byte(b.table.Family), unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
	if _, err := d.c.Send(req); err != nil {
		return nil, fmt.Errorf("dump set %s: %w", set, err)
	}
	var out []nftables.SetElement
	for {
		var n int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, _, _, _, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			return nil, fmt.Errorf("dump set %s: %w", set, err)
		}
		msgs, err := syscallMessages(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case netlink.Done:
				return out, nil
			case netlink.Error:
				if len(m.Data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
						return nil, fmt.Errorf("dump set %s: %w", set, unix.Errno(-code))
					}
				}
				return out, nil
			}
			if len(m.Data) < 4 {
				continue
			}
			els, err := decodeElements(m.Data[4:])
			if err != nil {
				return nil, fmt.Errorf("dump set %s: %w", set, err)
			}
			out = append(out, els...)
		}
	}
}

// syscallMessages splits a datagram into netlink messages.
func syscallMessages(b []byte) ([]netlink.Message, error) {
	var out []netlink.Message
	for len(b) >= 16 {
		l := int(binary.NativeEndian.Uint32(b))
		if l < 16 || l > len(b) {
			return nil, fmt.Errorf("netlink: bad message length %d", l)
		}
		var m netlink.Message
		if err := m.UnmarshalBinary(b[:l]); err != nil {
			return nil, err
		}
		out = append(out, m)
		b = b[(l+3)&^3:]
	}
	return out, nil
}

// decodeElements reads the elements of one NFT_MSG_NEWSETELEM message:
// key, data and verdict (as raw verdict attributes in Val, as the library
// returns them).
func decodeElements(b []byte) ([]nftables.SetElement, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	var out []nftables.SetElement
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				list.Nested(func(el *netlink.AttributeDecoder) error {
					var e nftables.SetElement
					for el.Next() {
						switch el.Type() {
						case unix.NFTA_SET_ELEM_FLAGS:
							e.IntervalEnd = el.Uint32()&unix.NFT_SET_ELEM_INTERVAL_END != 0
						case unix.NFTA_SET_ELEM_KEY:
							el.Nested(func(d *netlink.AttributeDecoder) error {
								for d.Next() {
									if d.Type() == unix.NFTA_DATA_VALUE {
										e.Key = bytes.Clone(d.Bytes())
									}
								}
								return nil
							})
						case unix.NFTA_SET_ELEM_USERDATA:
							e.Comment, _ = userdata.GetString(el.Bytes(), userdata.NFTNL_UDATA_SET_ELEM_COMMENT)
						case unix.NFTA_SET_ELEM_DATA:
							el.Nested(func(d *netlink.AttributeDecoder) error {
								for d.Next() {
									switch d.Type() {
									case unix.NFTA_DATA_VALUE:
										e.Val = bytes.Clone(d.Bytes())
									case unix.NFTA_DATA_VERDICT:
										e.VerdictData = decodeVerdict(d.Bytes())
									}
								}
								return nil
							})
						}
					}
					out = append(out, e)
					return nil
				})
			}
			return nil
		})
	}
	return out, ad.Err()
}
