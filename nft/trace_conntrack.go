package nft

import (
	"net/netip"
	"sort"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/dataplane"
)

// conntrackOf lists the conntrack entries of the client src (port sport, 0:
// any) to dst over proto. An entry's packets follow it and not the
// ruleset: the entry's reply source is where they go. Elsewhere is set when
// that is not one of the endpoints the ruleset picks for a new connection.
func conntrackOf(h *netlink.Handle, src netip.Addr, sport uint16, dst netip.AddrPort, proto byte, endpoints map[string]float64) ([]dataplane.TraceConntrack, error) {
	fam := netlink.InetFamily(unix.AF_INET)
	if src.Is6() {
		fam = unix.AF_INET6
	}
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil {
		return nil, err
	}
	var out []dataplane.TraceConntrack
	for _, f := range flows {
		fw := f.Forward
		fs, _ := netip.AddrFromSlice(fw.SrcIP)
		fd, _ := netip.AddrFromSlice(fw.DstIP)
		if fw.Protocol != proto || fs.Unmap() != src || fd.Unmap() != dst.Addr() || fw.DstPort != dst.Port() {
			continue
		}
		if sport != 0 && fw.SrcPort != sport {
			continue
		}
		rs, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		ep := netip.AddrPortFrom(rs.Unmap(), f.Reverse.SrcPort).String()
		c := dataplane.TraceConntrack{
			Source:   netip.AddrPortFrom(src, fw.SrcPort).String(),
			Endpoint: ep,
			Exact:    sport != 0,
		}
		if _, ok := endpoints[ep]; !ok {
			c.Elsewhere = true
		}
		if ti, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
			c.State = tcpStates[ti.State]
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Source < out[j].Source })
	return out, nil
}

// tcpStates names conntrack's TCP states (enum tcp_conntrack).
var tcpStates = map[uint8]string{0: "none", 1: "syn-sent", 2: "syn-recv", 3: "established", 4: "fin-wait",
	5: "close-wait", 6: "last-ack", 7: "time-wait", 8: "close", 9: "syn-sent2"}
