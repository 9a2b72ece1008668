package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// ipsets holds the netfilter netlink sockets for the source-range sets
// (ipset hash:net, one per Service and family, see plan.addRangeSet). Sets
// are created, changed element by element and destroyed over netlink
// (vishvananda/netlink); they are listed with an own small parser, which
// reads only what onehop needs and logs nothing about attributes newer
// kernels add.
type ipsets struct {
	h    *netlink.Handle
	list *nl.SocketHandle
	// pending are sets to destroy once nothing refers to them any more:
	// iptables-nft releases a rule's reference after its transaction, a
	// moment after iptables-restore returns.
	pending map[string]bool
}

// openIPSets opens the sockets in the calling thread's network namespace.
func openIPSets() (*ipsets, error) {
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	s, err := nl.Subscribe(unix.NETLINK_NETFILTER)
	if err != nil {
		h.Close()
		return nil, err
	}
	return &ipsets{h: h, list: &nl.SocketHandle{Socket: s}, pending: map[string]bool{}}, nil
}

func (i *ipsets) close() {
	i.h.Close()
	i.list.Close()
}

// guard turns a panic of the netlink library (it asserts its errors are
// errnos) into an error.
func guard(what string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("ipvs: ipset %s: %v", what, r)
		}
	}()
	return fn()
}

// read lists onehop's sets (by name prefix) into pl.Sets. A kernel without
// ip_set has none.
func (i *ipsets) read(pl *plan) error {
	if i == nil {
		return nil
	}
	req := nl.NewNetlinkRequest(nl.IPSET_CMD_LIST|(unix.NFNL_SUBSYS_IPSET<<8), nl.GetIpsetFlags(nl.IPSET_CMD_LIST))
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: i.list}
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		if errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
			return nil // no ip_set in this kernel (nfnetlink knows no such subsystem): no sets
		}
		return fmt.Errorf("ipvs: listing ipsets: %w", err)
	}
	for _, m := range msgs {
		name, fam, elems := parseSetMsg(m)
		if pl.Filter.read(name, fam, elems) {
			continue
		}
		if !strings.HasPrefix(name, rangeSetPrefix) {
			continue
		}
		s := pl.Sets[name]
		s.Family = fam
		for _, e := range elems { // a large set comes in several messages
			s.Nets = append(s.Nets, e.Net)
		}
		pl.Sets[name] = s
	}
	for name, s := range pl.Sets {
		slices.SortFunc(s.Nets, comparePrefix)
		s.Nets = slices.Compact(s.Nets)
		pl.Sets[name] = s
	}
	return nil
}

// setElem is one element of an ipset: a network (hash:net) or an address
// with a protocol and port (hash:ip,port; Proto is not 0).
type setElem struct {
	Net   netip.Prefix
	Proto uint8
	Port  uint16
}

// parseSetMsg reads one IPSET_CMD_LIST answer: the set's name, family and
// elements (hash:net and hash:ip,port).
func parseSetMsg(m []byte) (string, portal.Family, []setElem) {
	if len(m) < 4 {
		return "", 0, nil
	}
	var name string
	fam := portal.IPv4
	var elems []setElem
	for a := range nl.ParseAttributes(m[4:]) {
		switch a.Type & nl.NLA_TYPE_MASK {
		case nl.IPSET_ATTR_SETNAME:
			name = nl.BytesToString(a.Value)
		case nl.IPSET_ATTR_FAMILY:
			if len(a.Value) > 0 && a.Value[0] == unix.AF_INET6 {
				fam = portal.IPv6
			}
		case nl.IPSET_ATTR_ADT:
			for d := range nl.ParseAttributes(a.Value) {
				if d.Type&nl.NLA_TYPE_MASK != nl.IPSET_ATTR_DATA {
					continue
				}
				var addr netip.Addr
				bits := -1
				var el setElem
				for e := range nl.ParseAttributes(d.Value) {
					switch e.Type & nl.NLA_TYPE_MASK {
					case nl.IPSET_ATTR_PORT:
						if len(e.Value) >= 2 {
							el.Port = binary.BigEndian.Uint16(e.Value)
						}
					case nl.IPSET_ATTR_PROTO:
						if len(e.Value) > 0 {
							el.Proto = e.Value[0]
						}
					case nl.IPSET_ATTR_IP:
						for ip := range nl.ParseAttributes(e.Value) {
							if x, ok := netip.AddrFromSlice(ip.Value); ok {
								addr = x
							}
						}
					case nl.IPSET_ATTR_CIDR:
						if len(e.Value) > 0 {
							bits = int(e.Value[0])
						}
					}
				}
				if addr.IsValid() {
					if bits < 0 {
						bits = addr.BitLen()
					}
					if p, err := addr.Prefix(bits); err == nil {
						el.Net = p
						elems = append(elems, el)
					}
				}
			}
		}
	}
	return name, fam, elems
}

// setBatch is how many elements one netlink message adds or deletes
// (about 28 bytes each), as `ipset restore` batches them.
const setBatch = 1000

// elements adds (IPSET_CMD_ADD) or deletes (IPSET_CMD_DEL) nets in set
// name, setBatch to a message; an element already there (add) or already
// gone (del) is no error. It returns the number of messages sent.
func (i *ipsets) elements(cmd int, name string, nets []netip.Prefix) (int, error) {
	elems := make([]setElem, len(nets))
	for n, p := range nets {
		elems[n] = setElem{Net: p}
	}
	return i.elems(cmd, name, elems)
}

// elems is elements for any element kind.
func (i *ipsets) elems(cmd int, name string, elems []setElem) (int, error) {
	msgs := 0
	for len(elems) > 0 {
		chunk := elems[:min(len(elems), setBatch)]
		elems = elems[len(chunk):]
		req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), nl.GetIpsetFlags(cmd))
		req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: i.list}
		req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(unix.AF_NETLINK), Version: nl.NFNETLINK_V0})
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)))
		adt := nl.NewRtAttr(nl.IPSET_ATTR_ADT|int(nl.NLA_F_NESTED), nil)
		for _, e := range chunk {
			p := e.Net
			typ := nl.IPSET_ATTR_IPADDR_IPV4
			if p.Addr().Is6() {
				typ = nl.IPSET_ATTR_IPADDR_IPV6
			}
			ip := nl.NewRtAttr(nl.IPSET_ATTR_IP|int(nl.NLA_F_NESTED), nil)
			ip.AddChild(nl.NewRtAttr(typ|int(nl.NLA_F_NET_BYTEORDER), p.Addr().AsSlice()))
			data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
			data.AddChild(ip)
			if e.Proto != 0 {
				port := make([]byte, 2)
				binary.BigEndian.PutUint16(port, e.Port)
				data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|int(nl.NLA_F_NET_BYTEORDER), port))
				data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PROTO, nl.Uint8Attr(e.Proto)))
			} else {
				data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_CIDR, nl.Uint8Attr(uint8(p.Bits()))))
			}
			adt.AddChild(data)
		}
		req.AddData(adt)
		// The kernel wants a line number with a batch (for its errors).
		req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_LINENO, nl.Uint32Attr(0)))
		msgs++
		if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err != nil {
			return msgs, err
		}
	}
	return msgs, nil
}

// apply creates the wanted sets that are missing and changes the others
// element by element; it runs before the rules that refer to them. It
// returns the number of netlink messages sent.
func (i *ipsets) apply(have, want *plan) (int, error) {
	msgs := 0
	for _, name := range sortedKeys(want.Sets) {
		w := want.Sets[name]
		if i == nil {
			return msgs, fmt.Errorf("ipvs: loadBalancerSourceRanges need ipsets, but this kernel has no netfilter netlink")
		}
		h, ok := have.Sets[name]
		if ok && h.Family != w.Family {
			// Not what onehop makes: replace it (no rule of ours uses it).
			msgs++
			if err := guard("destroy", func() error { return i.h.IpsetDestroy(name) }); err != nil && !isNoSet(err) {
				return msgs, fmt.Errorf("ipvs: ipset %s of the wrong family: %w", name, err)
			}
			ok = false
		}
		if !ok {
			msgs++
			fam := uint8(unix.AF_INET)
			if w.Family == portal.IPv6 {
				fam = unix.AF_INET6
			}
			maxElem := uint32(65536)
			if n := uint32(len(w.Nets)); n > maxElem/2 {
				maxElem = 2 * n
			}
			if err := guard("create", func() error {
				return i.h.IpsetCreate(name, "hash:net", netlink.IpsetCreateOptions{Family: fam, MaxElements: maxElem, Replace: true})
			}); err != nil {
				return msgs, fmt.Errorf("ipvs: creating ipset %s (needs the ip_set and ip_set_hash_net modules): %w", name, err)
			}
			h = rangeSet{Family: w.Family}
			if i.pending[name] {
				// Still there from before, waiting to be destroyed: the
				// create found it, empty it.
				delete(i.pending, name)
				msgs++
				if err := guard("flush", func() error { return i.h.IpsetFlush(name) }); err != nil {
					return msgs, fmt.Errorf("ipvs: flushing ipset %s: %w", name, err)
				}
			}
		}
		var add, del []netip.Prefix
		for _, p := range w.Nets {
			if _, found := slices.BinarySearchFunc(h.Nets, p, comparePrefix); !found {
				add = append(add, p)
			}
		}
		for _, p := range h.Nets {
			if _, found := slices.BinarySearchFunc(w.Nets, p, comparePrefix); !found {
				del = append(del, p)
			}
		}
		n, err := i.elements(nl.IPSET_CMD_ADD, name, add)
		msgs += n
		if err != nil {
			return msgs, fmt.Errorf("ipvs: adding %d ranges to ipset %s: %w", len(add), name, err)
		}
		n, err = i.elements(nl.IPSET_CMD_DEL, name, del)
		msgs += n
		if err != nil {
			return msgs, fmt.Errorf("ipvs: removing %d ranges from ipset %s: %w", len(del), name, err)
		}
	}
	return msgs, nil
}

// destroyStale destroys the sets have holds and want does not; it runs
// after the rules that referred to them are gone. A set still referenced
// (the kernel releases a deleted rule's reference a moment later) is left
// for reap.
func (i *ipsets) destroyStale(have, want *plan) int {
	if i == nil {
		return 0
	}
	for name := range have.Sets {
		if _, ok := want.Sets[name]; !ok {
			i.pending[name] = true
		}
	}
	return i.reap()
}

// reap destroys the pending sets it can; it returns the messages sent.
func (i *ipsets) reap() int {
	if i == nil {
		return 0
	}
	msgs := 0
	for name := range i.pending {
		msgs++
		err := guard("destroy", func() error { return i.h.IpsetDestroy(name) })
		if err == nil || isNoSet(err) {
			delete(i.pending, name)
		}
	}
	return msgs
}

// destroyAll destroys every set of onehop's (Cleanup, after the rules are
// gone), waiting a little for references the kernel still holds.
func (i *ipsets) destroyAll() error {
	if i == nil {
		return nil
	}
	pl := newPlan()
	if err := i.read(pl); err != nil {
		return err
	}
	for name := range pl.Sets {
		i.pending[name] = true
	}
	for name := range pl.Filter.Sets {
		i.pending[name] = true
	}
	for try := 0; len(i.pending) > 0 && try < 20; try++ {
		if try > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		i.reap()
	}
	if len(i.pending) > 0 {
		return fmt.Errorf("ipvs: ipsets still in use: %v", sortedKeys(i.pending))
	}
	return nil
}

// isNoSet: the set does not exist.
func isNoSet(err error) bool { return errors.Is(err, syscall.ENOENT) }
