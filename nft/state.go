package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
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
const layoutVersion = "onehop8"

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
	f := strings.SplitN(string(tag), " ", 4)
	if len(f) < 3 || f[0] != layoutVersion || len(f) == 4 && !strings.HasPrefix(f[3], topologyTag) {
		return 0, false
	}
	id, err := strconv.ParseUint(f[1], 10, 32)
	return uint32(id), err == nil
}

// topologyTag follows the hash in the tag of a chain that holds a
// portal's Cluster-policy endpoints when the portal says how topology
// chose them: dump-rules reads it back, as the kernel holds no other
// text for a chain's rules.
const topologyTag = "topology="

// maxTopologyText bounds the topology text in a tag: a rule's user data
// holds 256 bytes (NFT_USERDATA_MAXLEN), the rest of the tag under 40.
const maxTopologyText = 200

// withTopology appends text to tag, cut to maxTopologyText bytes.
func withTopology(tag []byte, text string) []byte {
	if text == "" {
		return tag
	}
	if len(text) > maxTopologyText {
		text = text[:maxTopologyText-3] + "..."
	}
	return append(append(append(tag, ' '), topologyTag...), text...)
}

// tagTopology returns the topology text of a tag, "" when it has none.
func tagTopology(tag []byte) string {
	f := strings.SplitN(string(tag), " ", 4)
	if len(f) < 4 || f[0] != layoutVersion {
		return ""
	}
	return strings.TrimPrefix(f[3], topologyTag)
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
	switch {
	case body.maglev && len(body.endpoints) > 0:
		// Its rule holds the table's size, not the endpoints: they are
		// the endpoint maps' elements, which a full sync compares on
		// their own. An endpoint replaced by an element update leaves
		// the rule and its tag as they are, and a restart rewrites none.
		buf = append(buf, "maglev table of "...)
		buf = strconv.AppendInt(buf, int64(body.tableSize()), 10)
	case body.usesEndpointMap():
		// The same for numgen: the rule holds the number of endpoints.
		buf = append(buf, "map of "...)
		buf = strconv.AppendInt(buf, int64(len(body.endpoints)), 10)
	default:
		for i, ep := range body.endpoints {
			if i > 0 {
				buf = append(buf, ' ')
			}
			buf = ep.AppendTo(buf)
		}
	}
	buf = append(buf, "] affinity:"...)
	buf = strconv.AppendUint(buf, uint64(body.affinity), 10)
	if body.affinity > 0 {
		// The affinity sets are the portal's, shared by its chains;
		// chains written when each had its own are rewritten.
		buf = append(buf, " shared"...)
	}
	buf = append(buf, " dropIfEmpty:"...)
	buf = strconv.AppendBool(buf, body.dropIfEmpty)
	buf = append(buf, "}|"...)
	buf = append(buf, b.cfgKey()...)
	if body.maglev {
		// Another rule (maglevRule) from the same fields: a chain
		// switched between random and maglev is rewritten on restart.
		buf = append(buf, "|maglev"...)
	}
	return withTopology(ruleTag(id, buf), body.topology)
}

// cfgKey is what of the configuration the rules are made from (the
// configuration does not change: New formats it once).
func (b *Backend) cfgKey() string { return b.cfgKeyText }

func (b *Backend) formatCfgKey() string {
	return fmt.Sprintf("%v|%v|%v|%d|%v", b.cfg.ClusterCIDRs, b.cfg.ServiceCIDRs, b.cfg.MasqueradeAll, b.cfg.MasqueradeMark(), b.cfg.SourceRangesOnNodePorts)
}

// fixedTag is the tag of the rules of the fixed chains. A fixed chain
// whose rules a version lays out anew, for the same configuration, adds a
// marker, so that the first sync after the upgrade rewrites it.
func (b *Backend) fixedTag(chain string) []byte {
	if chain == chainNoEndpoints {
		// Unallocated cluster IPs are matched by @service-cidrs<f>, no
		// longer by prefixes in the rules; node ports are checked apart,
		// from filter-input only (chainNoEndpointsNP).
		return ruleTag(0, chain+"|"+b.cfgKey()+"|service-cidrs set|node ports apart")
	}
	return ruleTag(0, chain+"|"+b.cfgKey())
}

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
	// rewrite names the flat maps that were not read back: a full sync
	// flushes them and writes them anew (flat.go, flatReadBackMax).
	rewrite map[string]bool
}

// readState reads the table for an in-place full sync. It returns nil,
// nil when the table does not exist, and nil with an error when it cannot
// be reconciled in place (a fixed set of another type, left by another
// layout version): the caller then replaces the table as a whole. sizeHint,
// when not nil, says how many elements a set is likely to hold (what the
// sync will want), so that its list is made once at that size.
func (b *Backend) readState(conn *nftables.Conn, sizeHint func(set string) int, rewriteFlat bool) (*kernelState, error) {
	if _, err := conn.ListTableOfFamily(b.table.Name, b.table.Family); err != nil {
		return nil, nil
	}
	k := &kernelState{chains: map[string]bool{}, tags: map[string][]byte{}, rules: map[string]int{},
		sets: map[string]*setDecl{}, elems: map[string][]nftables.SetElement{}, rewrite: map[string]bool{}}
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
		if !sameSetTypes(have, want) {
			return nil, fmt.Errorf("set %s has another type than this version uses", want.Name)
		}
		if rewriteFlat && isFlatMap(want.Name) {
			k.rewrite[want.Name] = true
			continue
		}
		n := 0
		if sizeHint != nil {
			n = sizeHint(want.Name)
		}
		els, err := d.dump(want.Name, n)
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
		els, err := d.dump(name, 0)
		if err != nil {
			return nil, err
		}
		k.elems[name] = els
	}
	return k, nil
}

// sameSetTypes reports whether the kernel's set have is declared as want:
// the same key (its type and length, and the user data that declares how
// nft prints it: a layout can change a key's type and keep its length),
// and for a map the same data.
func sameSetTypes(have *setDecl, want *nftables.Set) bool {
	if have.keyType != want.KeyType.GetNFTMagic() || have.keyLen != want.KeyType.Bytes ||
		have.isMap() != want.IsMap || !bytes.Equal(have.udata, setUserData(want)) {
		return false
	}
	if want.IsMap && !isVerdictType(want.DataType) {
		return have.dataType == want.DataType.GetNFTMagic() && have.dataLen == want.DataType.Bytes
	}
	return true
}

// elemEqual reports whether a wanted element (want) and one read back from
// the kernel (have) map the same key to the same value, with the same
// comment (the way in and portal dump-rules reports: two Services' ways in
// without endpoints share a verdict, goto reject). The library returns a
// verdict map's data undecoded, in Val.
func elemEqual(want, have nftables.SetElement) bool {
	if !bytes.Equal(want.Key, have.Key) || want.Comment != have.Comment || want.IntervalEnd != have.IntervalEnd {
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
	v := &expr.Verdict{}
	err := walkAttrs(b, func(typ uint16, d []byte) error {
		switch typ {
		case unix.NFTA_VERDICT_CODE:
			if len(d) < 4 {
				return errBadAttribute
			}
			v.Kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(d)))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = string(bytes.TrimRight(d, "\x00"))
		}
		return nil
	})
	if err != nil {
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

// dump reads the elements of the named set, again while the kernel's dump
// holds an element twice (readElems).
func (d *elemDumper) dump(set string, sizeHint int) ([]nftables.SetElement, error) {
	els, err := readElems(func() ([]nftables.SetElement, error) { return d.dumpOnce(set, sizeHint) })
	if errors.Is(err, errRepeats) {
		err = fmt.Errorf("dump set %s: %w", set, err)
	}
	return els, err
}

func (d *elemDumper) dumpOnce(set string, sizeHint int) ([]nftables.SetElement, error) {
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
	out := make([]nftables.SetElement, 0, sizeHint)
	comments := map[string]string{}
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
		// The elements keep their keys and values in one copy of the
		// datagram instead of a copy each.
		done := false
		var errno error
		err = walkMessages(bytes.Clone(buf[:n]), func(typ uint16, data []byte) error {
			switch typ {
			case uint16(netlink.Done):
				done = true
				return nil
			case uint16(netlink.Error):
				done = true
				if len(data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(data)); code != 0 {
						errno = unix.Errno(-code)
					}
				}
				return nil
			}
			if done || len(data) < 4 {
				return nil
			}
			var err error
			out, err = decodeElements(out, data[4:], comments)
			return err
		})
		switch {
		case err != nil:
			return nil, fmt.Errorf("dump set %s: %w", set, err)
		case errno != nil:
			return nil, fmt.Errorf("dump set %s: %w", set, errno)
		case done:
			return out, nil
		}
	}
}

// decodeElements appends the elements of one NFT_MSG_NEWSETELEM message
// to out: key, data and verdict (as raw verdict attributes in Val, as the
// library returns them). Keys and values point into b. A comment seen
// before, in comments (nil: none kept), is shared: the elements of an
// endpoint map name their chain, one comment for all its endpoints.
func decodeElements(out []nftables.SetElement, b []byte, comments map[string]string) ([]nftables.SetElement, error) {
	value := func(b []byte, dst *[]byte, verdict **expr.Verdict) error {
		return walkAttrs(b, func(typ uint16, d []byte) error {
			switch {
			case typ == unix.NFTA_DATA_VALUE:
				*dst = d
			case typ == unix.NFTA_DATA_VERDICT && verdict != nil:
				*verdict = decodeVerdict(d)
			}
			return nil
		})
	}
	element := func(b []byte) error {
		var e nftables.SetElement
		err := walkAttrs(b, func(typ uint16, d []byte) error {
			switch typ {
			case unix.NFTA_SET_ELEM_FLAGS:
				if len(d) < 4 {
					return errBadAttribute
				}
				e.IntervalEnd = binary.BigEndian.Uint32(d)&unix.NFT_SET_ELEM_INTERVAL_END != 0
			case unix.NFTA_SET_ELEM_KEY:
				return value(d, &e.Key, nil)
			case unix.NFTA_SET_ELEM_USERDATA:
				c := bytes.TrimSuffix(userdata.Get(d, userdata.NFTNL_UDATA_SET_ELEM_COMMENT), []byte{0})
				if s, ok := comments[string(c)]; ok {
					e.Comment = s
				} else if e.Comment = string(c); comments != nil {
					comments[e.Comment] = e.Comment
				}
			case unix.NFTA_SET_ELEM_DATA:
				return value(d, &e.Val, &e.VerdictData)
			}
			return nil
		})
		out = append(out, e)
		return err
	}
	err := walkAttrs(b, func(typ uint16, d []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return walkAttrs(d, func(_ uint16, el []byte) error { return element(el) })
	})
	return out, err
}
