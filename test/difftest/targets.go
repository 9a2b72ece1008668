package difftest

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/onehop/onehop/test/netns"
)

// vantage is where a probe is sent from.
type vantage struct {
	Name    string
	Outside bool               // the outside client, beyond the router
	Node    bool               // a node itself
	netns   func(*Twin) string // the namespace, in a given twin
}

// vantages are the outside client, pod 1 of each node (an endpoint of some
// Services, so hairpin traffic is probed too) and each node itself. Each
// has an address of each family; a probe's destination picks the source's.
func vantages() []vantage {
	client := fmt.Sprintf("outside client %s, %s", netns.ClientIP(), clientIP6())
	out := []vantage{{Name: client, Outside: true, netns: func(tw *Twin) string { return tw.ClientNS }}}
	for n := 1; n <= nodes; n++ {
		p := podRef{n, 1}
		out = append(out, vantage{Name: fmt.Sprintf("%s on %s", p.Name(), nodeName(n)), netns: func(tw *Twin) string { return tw.pod(p).Netns }})
	}
	for n := 1; n <= nodes; n++ {
		out = append(out, vantage{Name: nodeName(n), Node: true, netns: func(tw *Twin) string { return tw.node(n).Netns }})
	}
	return out
}

// target is one way in: an address, port and protocol, and what it is.
type target struct {
	Service string // "" for an address no Service has
	Port    string // the Service port's name; "" when no port of it
	Way     string // "cluster IP", "NodePort on node-1", ...
	Proto   string // "tcp" or "udp"
	Addr    string // host:port
	// Outside says whether the outside client can be routed there; inside
	// the cluster every vantage can.
	Outside bool
	// Flow names the pod of a flow opened before a change, for a flow's
	// outcome across it; "" for a probe.
	Flow string
	// Sticky says the Service has ClientIP affinity: one client's probes to
	// it are sent one after another, not at once, or the first requests of
	// two probes could race to set the client's pod.
	Sticky bool
}

func (t target) String() string {
	what := t.Way
	if t.Service != "" {
		what = t.Service + " " + what
		if t.Port != "" {
			what += " port " + t.Port
		}
	}
	return fmt.Sprintf("%s %s/%s", what, t.Addr, t.Proto)
}

func proto(p v1.Protocol) string { return strings.ToLower(string(p)) }

func hostPort(ip string, port int32) string { return net.JoinHostPort(ip, strconv.Itoa(int(port))) }

// undefinedPort is a port no generated Service defines.
const undefinedPort = 7

// targets lists every way into s: each of its cluster IPs (one per IP
// family) on each port and on a port it does not define; for NodePort
// and LoadBalancer Services each node's IPv4 and IPv6 address on each
// NodePort (whatever the Service's families); its externalIPs and
// load-balancer ingress IPs on each port.
func (s *ServiceCase) targets() []target {
	spec := s.Service.Spec
	name := s.Service.Name
	var out []target
	defer func() {
		for i := range out {
			out[i].Sticky = spec.SessionAffinity == v1.ServiceAffinityClientIP
		}
	}()
	for _, ip := range spec.ClusterIPs {
		for _, p := range spec.Ports {
			out = append(out, target{Service: name, Port: p.Name, Way: "cluster IP", Proto: proto(p.Protocol), Addr: hostPort(ip, p.Port)})
		}
		out = append(out, target{Service: name, Way: "cluster IP, undefined port", Proto: proto(spec.Ports[0].Protocol), Addr: hostPort(ip, undefinedPort)})
	}
	for _, p := range spec.Ports {
		if p.NodePort == 0 {
			continue
		}
		for n := 1; n <= nodes; n++ {
			for _, ip := range []string{nodeIP(n).String(), nodeIP6(n).String()} {
				out = append(out, target{Service: name, Port: p.Name, Way: "NodePort on " + nodeName(n), Proto: proto(p.Protocol),
					Addr: hostPort(ip, p.NodePort), Outside: true})
			}
		}
	}
	for _, ip := range spec.ExternalIPs {
		for _, p := range spec.Ports {
			out = append(out, target{Service: name, Port: p.Name, Way: "externalIP", Proto: proto(p.Protocol), Addr: hostPort(ip, p.Port), Outside: true})
		}
	}
	for _, ip := range s.Ingress {
		for _, p := range spec.Ports {
			out = append(out, target{Service: name, Port: p.Name, Way: "load-balancer IP", Proto: proto(p.Protocol), Addr: hostPort(ip, p.Port), Outside: true})
		}
	}
	return out
}

// probe is one vantage point and one way in.
type probe struct {
	From vantage
	To   target
}

func (p probe) String() string { return fmt.Sprintf("from %s to %s", p.From.Name, p.To) }

// probes lists every probe of c: each way in of each Service from every
// vantage point that can be routed there, and an unallocated cluster IP
// of each family from inside.
func (c *Case) probes() []probe { return c.probesWith(nil) }

// probesWith is probes, and every way into the Services of gone too (the
// Services a change deleted).
func (c *Case) probesWith(gone []*ServiceCase) []probe {
	var ts []target
	for _, s := range c.Services {
		ts = append(ts, s.targets()...)
	}
	for _, s := range gone {
		for _, t := range s.targets() {
			t.Way += " (deleted)"
			ts = append(ts, t)
		}
	}
	for _, ip := range []netip.Addr{unallocatedIP, unallocatedIP6} {
		ts = append(ts, target{Way: "unallocated cluster IP", Proto: "tcp", Addr: hostPort(ip.String(), 80)})
	}
	var out []probe
	for _, t := range ts {
		for _, v := range vantages() {
			if v.Outside && !t.Outside {
				continue
			}
			out = append(out, probe{From: v, To: t})
		}
	}
	return out
}
