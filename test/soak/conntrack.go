package soak

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// conntrack reads the connection tracking table of one network namespace.
type conntrack struct {
	h *netlink.Handle
}

func openConntrack(netnsPath string) (*conntrack, error) {
	f, err := os.Open(netnsPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, err := netlink.NewHandleAt(netns.NsHandle(f.Fd()), unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	return &conntrack{h: h}, nil
}

func (c *conntrack) Close() { c.h.Close() }

// Flows lists both families' entries. An interrupted dump (the table
// changed while it was read) is read again, up to a few times; the last
// one is returned as it is.
func (c *conntrack) Flows() ([]*netlink.ConntrackFlow, error) {
	var out []*netlink.ConntrackFlow
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		var flows []*netlink.ConntrackFlow
		var err error
		for range 5 {
			flows, err = c.h.ConntrackTableList(netlink.ConntrackTable, fam)
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, err
		}
		out = append(out, flows...)
	}
	return out, nil
}

// udpServed maps each UDP address a Service is reached at from a node (its
// cluster IPs, and the node's own addresses with its node ports) to the
// endpoints (address and target port) it may be DNATed to, as the API
// holds them: ready endpoints only, which is all the soak writes.
func udpServed(ctx context.Context, client kubernetes.Interface, nodeAddrs []netip.Addr) (map[netip.AddrPort]map[netip.AddrPort]bool, error) {
	svcs, err := client.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	slices, err := client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	// endpoints[namespace/service/port name] = ready address:port
	endpoints := map[string][]netip.AddrPort{}
	for _, s := range slices.Items {
		for _, p := range s.Ports {
			if p.Protocol == nil || *p.Protocol != v1.ProtocolUDP || p.Port == nil {
				continue
			}
			key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName] + "/" + derefString(p.Name)
			for _, e := range s.Endpoints {
				if e.Conditions.Ready == nil || !*e.Conditions.Ready {
					continue
				}
				for _, a := range e.Addresses {
					if ip, err := netip.ParseAddr(a); err == nil {
						endpoints[key] = append(endpoints[key], netip.AddrPortFrom(ip, uint16(*p.Port)))
					}
				}
			}
		}
	}
	out := map[netip.AddrPort]map[netip.AddrPort]bool{}
	add := func(at netip.AddrPort, eps []netip.AddrPort) {
		m := map[netip.AddrPort]bool{}
		for _, e := range eps {
			m[e] = true
		}
		out[at] = m
	}
	for _, svc := range svcs.Items {
		for _, p := range svc.Spec.Ports {
			if p.Protocol != v1.ProtocolUDP {
				continue
			}
			eps := endpoints[svc.Namespace+"/"+svc.Name+"/"+p.Name]
			for _, ip := range svc.Spec.ClusterIPs {
				if a, err := netip.ParseAddr(ip); err == nil {
					add(netip.AddrPortFrom(a, uint16(p.Port)), eps)
				}
			}
			if p.NodePort != 0 {
				for _, a := range nodeAddrs {
					add(netip.AddrPortFrom(a, uint16(p.NodePort)), eps)
				}
			}
		}
	}
	return out, nil
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// staleUDP returns the UDP entries that were DNATed (their reply comes from
// another address or port than the original destination) and that the
// Services no longer send that way: to an address no Service has any more,
// or to an endpoint that no longer backs it. It also returns how many
// DNATed UDP entries it looked at.
func staleUDP(flows []*netlink.ConntrackFlow, served map[netip.AddrPort]map[netip.AddrPort]bool) (stale []string, checked int) {
	for _, f := range flows {
		if f.Forward.Protocol != unix.IPPROTO_UDP {
			continue
		}
		dst, ok1 := addrPort(f.Forward.DstIP, f.Forward.DstPort)
		to, ok2 := addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort)
		if !ok1 || !ok2 || dst == to {
			continue
		}
		checked++
		eps, ok := served[dst]
		switch {
		case !ok:
			stale = append(stale, fmt.Sprintf("udp %s -> %s: no Service has %s", f.Forward.SrcIP, dst, dst))
		case !eps[to]:
			stale = append(stale, fmt.Sprintf("udp %s -> %s DNATed to %s, not an endpoint of it", f.Forward.SrcIP, dst, to))
		}
	}
	return stale, checked
}

func addrPort(ip []byte, port uint16) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port), ok
}
