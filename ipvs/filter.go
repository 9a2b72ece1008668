package ipvs

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/portal"
)

// The Service IP filter. Every cluster, external and load-balancer IP is a
// local address of the node (on onehop-ipvs0), so without it a connection
// to such an IP at a port no Service has reaches the node's own sockets (a
// node's sshd or kubelet at <cluster IP>:22 or :10250). Filter INPUT runs
// before IPVS takes packets at LOCAL_IN, and jumps to ONEHOP-IPVS-FILTER:
//
//	-m set --match-set ONEHOP-IPVS-PORTS dst,dst -j RETURN
//	-m conntrack --ctstate NEW -m set --match-set ONEHOP-IPVS-VIPS dst -j REJECT
//
// ONEHOP-IPVS-VIPS (hash:net of /32 or /128) holds the addresses on the
// dummy interface, ONEHOP-IPVS-PORTS (hash:ip,port) each of their virtual
// servers' address, protocol and port, and the health-check node port of a
// Local-policy Service at its load-balancer IPs (cloud load balancers that
// put the IP on the node check it there). IPv6 has ONEHOP-IPVS-VIPS6 and
// ONEHOP-IPVS-PORTS6. Packets of the node itself to such an IP pass INPUT
// too (over lo), and replies to connections the node opened from one are
// not NEW. This is kube-proxy's KUBE-IPVS-FILTER (kubernetes #72236).

// chainFilter is the filter chain above, jumped to from INPUT.
const chainFilter = "ONEHOP-IPVS-FILTER"

func vipSetName(fam portal.Family) string {
	if fam == portal.IPv6 {
		return "ONEHOP-IPVS-VIPS6"
	}
	return "ONEHOP-IPVS-VIPS"
}

func portSetName(fam portal.Family) string {
	if fam == portal.IPv6 {
		return "ONEHOP-IPVS-PORTS6"
	}
	return "ONEHOP-IPVS-PORTS"
}

// filterRules is the fixed content of ONEHOP-IPVS-FILTER, as `iptables -S`
// prints it.
func filterRules(fam portal.Family) [][]string {
	reject := "icmp-port-unreachable"
	if fam == portal.IPv6 {
		reject = "icmp6-port-unreachable"
	}
	return [][]string{
		{"-m", "set", "--match-set", portSetName(fam), "dst,dst", "-j", "RETURN"},
		{"-m", "conntrack", "--ctstate", "NEW", "-m", "set", "--match-set", vipSetName(fam), "dst", "-j", "REJECT", "--reject-with", reject},
	}
}

// filterState is what the filter sets hold (or should hold).
type filterState struct {
	// Sets are the filter sets the kernel has; nil when the state is
	// derived from a plan rather than read from the kernel.
	Sets  map[string]bool
	VIPs  map[netip.Addr]bool
	Ports map[vsKey]bool
}

// read takes the elements of set name if it is a filter set, and reports
// whether it was.
func (f *filterState) read(name string, fam portal.Family, elems []setElem) bool {
	isVIPs, isPorts := name == vipSetName(fam), name == portSetName(fam)
	if !isVIPs && !isPorts {
		return false
	}
	if f.Sets == nil {
		f.Sets, f.VIPs, f.Ports = map[string]bool{}, map[netip.Addr]bool{}, map[vsKey]bool{}
	}
	f.Sets[name] = true
	for _, e := range elems {
		a := e.Net.Addr().Unmap()
		if isVIPs {
			f.VIPs[a] = true
		} else {
			f.Ports[vsKey{Proto: portal.Protocol(e.Proto), Addr: a, Port: e.Port}] = true
		}
	}
	return true
}

// filterOf is what the filter sets must hold for pl: its VIPs, and the
// virtual servers and allowed ports on them. Addresses in host (the node's
// own, on other interfaces: an external IP may be one) are left out, so
// that their other ports stay the node's.
func filterOf(pl *plan, host map[netip.Addr]bool) filterState {
	f := filterState{VIPs: map[netip.Addr]bool{}, Ports: map[vsKey]bool{}}
	for a := range pl.VIPs {
		if !host[a] {
			f.VIPs[a] = true
		}
	}
	for k, v := range pl.Servers {
		if v.Kind != kindNodePort {
			f.Ports[k] = true
		}
	}
	for k := range pl.Allowed {
		f.Ports[k] = true
	}
	return f
}

// hostAddrs are ownAddrs as a set.
func (b *Backend) hostAddrs() (map[netip.Addr]bool, error) {
	own, err := b.ownAddrs()
	out := map[netip.Addr]bool{}
	for _, a := range own {
		out[a] = true
	}
	return out, err
}

// filterMaxElem bounds each filter set: far above what 10k Services with a
// few IPs and ports each need.
const filterMaxElem = 1 << 20

// applyFilter creates the filter sets of the given families that have (read
// from the kernel) lacks, and sends the element differences. It runs before
// the rules that refer to the sets. It returns the messages sent.
func (i *ipsets) applyFilter(have, want filterState, fams []portal.Family) (int, error) {
	if i == nil {
		return 0, nil
	}
	msgs := 0
	for _, fam := range fams {
		for _, s := range []struct{ name, typ string }{{vipSetName(fam), "hash:net"}, {portSetName(fam), "hash:ip,port"}} {
			if have.Sets == nil || have.Sets[s.name] {
				continue
			}
			msgs++
			af := uint8(unix.AF_INET)
			if fam == portal.IPv6 {
				af = unix.AF_INET6
			}
			if err := guard("create", func() error {
				return i.h.IpsetCreate(s.name, s.typ, netlink.IpsetCreateOptions{Family: af, MaxElements: filterMaxElem, Replace: true})
			}); err != nil {
				return msgs, fmt.Errorf("ipvs: creating ipset %s (needs the ip_set_%s module): %w", s.name, s.typ, err)
			}
		}
		var addV, delV, addP, delP []setElem
		for a := range want.VIPs {
			if portal.FamilyOf(a) == fam && !have.VIPs[a] {
				addV = append(addV, setElem{Net: netip.PrefixFrom(a, a.BitLen())})
			}
		}
		for a := range have.VIPs {
			if portal.FamilyOf(a) == fam && !want.VIPs[a] {
				delV = append(delV, setElem{Net: netip.PrefixFrom(a, a.BitLen())})
			}
		}
		for k := range want.Ports {
			if k.family() == fam && !have.Ports[k] {
				addP = append(addP, portElem(k))
			}
		}
		for k := range have.Ports {
			if k.family() == fam && !want.Ports[k] {
				delP = append(delP, portElem(k))
			}
		}
		// Ports before addresses when adding, after when deleting: a
		// Service port is never refused on its way in or out.
		for _, step := range []struct {
			cmd   int
			name  string
			elems []setElem
		}{
			{nl.IPSET_CMD_ADD, portSetName(fam), addP}, {nl.IPSET_CMD_ADD, vipSetName(fam), addV},
			{nl.IPSET_CMD_DEL, vipSetName(fam), delV}, {nl.IPSET_CMD_DEL, portSetName(fam), delP},
		} {
			slices.SortFunc(step.elems, compareElem)
			n, err := i.elems(step.cmd, step.name, step.elems)
			msgs += n
			if err != nil {
				return msgs, fmt.Errorf("ipvs: ipset %s: %w", step.name, err)
			}
		}
	}
	return msgs, nil
}

func portElem(k vsKey) setElem {
	return setElem{Net: netip.PrefixFrom(k.Addr, k.Addr.BitLen()), Proto: uint8(k.Proto), Port: k.Port}
}

func compareElem(a, b setElem) int {
	if c := comparePrefix(a.Net, b.Net); c != 0 {
		return c
	}
	if a.Proto != b.Proto {
		return int(a.Proto) - int(b.Proto)
	}
	return int(a.Port) - int(b.Port)
}
