package netns

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/onehop/onehop/test/nsutil"
)

// buildTopology creates the router, client, control-plane, node and pod
// namespaces and wires them, dual-stack (see the package doc for the plan).
func (c *Cluster) buildTopology(ctx context.Context) error {
	c.Router = c.ID + "-rt"
	c.ClientNetns = c.ID + "-cl"
	c.ControlNS = c.ID + "-cp"

	// Router: a bridge for the node segment, a veth to the client.
	if err := c.addNamespace(ctx, c.Router); err != nil {
		return err
	}
	if err := forwarding(c.Router); err != nil {
		return err
	}
	if err := nsutil.IP(ctx, c.Router, "link", "add", "lan", "type", "bridge"); err != nil {
		return err
	}
	if err := addrsUp(ctx, c.Router, "lan", with24(routerNodeIP()), with64(routerNodeIP6())); err != nil {
		return err
	}

	if err := c.addNamespace(ctx, c.ClientNetns); err != nil {
		return err
	}
	if err := veth(ctx, c.Router, "to-client", c.ClientNetns, "eth0"); err != nil {
		return err
	}
	if err := addrsUp(ctx, c.Router, "to-client", with24(routerClientIP()), with64(routerClientIP6())); err != nil {
		return err
	}
	if err := addrsUp(ctx, c.ClientNetns, "eth0", with24(ClientIP()), with64(ClientIP6())); err != nil {
		return err
	}
	if err := defaultRoutes(ctx, c.ClientNetns, routerClientIP(), routerClientIP6()); err != nil {
		return err
	}

	// Control plane on the node segment.
	if err := c.addNamespace(ctx, c.ControlNS); err != nil {
		return err
	}
	if err := c.plugIntoLAN(ctx, c.ControlNS, "to-cp", ControlPlaneIP(), ControlPlaneIP6()); err != nil {
		return err
	}

	for i := 1; i <= c.cfg.Nodes; i++ {
		n := &Node{
			Index:    i,
			Name:     fmt.Sprintf("node-%d", i),
			Netns:    fmt.Sprintf("%s-n%d", c.ID, i),
			IP:       nodeIP(i).String(),
			IP6:      nodeIP6(i).String(),
			PodCIDR:  podCIDR(i).String(),
			PodCIDR6: podCIDR6(i).String(),
			Zone:     fmt.Sprintf("zone-%c", 'a'+(i-1)%26),
		}
		c.Nodes = append(c.Nodes, n)
		if err := c.buildNode(ctx, n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	// Every node routes the other nodes' pod CIDRs straight to them; the
	// router knows them all (for replies to the client).
	for _, n := range c.Nodes {
		for _, m := range c.Nodes {
			if m == n {
				continue
			}
			if err := routes(ctx, n.Netns, [][2]string{{m.PodCIDR, m.IP}, {m.PodCIDR6, m.IP6}}); err != nil {
				return err
			}
		}
		if err := routes(ctx, c.Router, [][2]string{{n.PodCIDR, n.IP}, {n.PodCIDR6, n.IP6}}); err != nil {
			return err
		}
	}
	if err := c.RouteExternal(ctx, ExternalCIDR, c.Nodes[0]); err != nil {
		return err
	}
	return c.RouteExternal(ctx, ExternalCIDR6, c.Nodes[0])
}

// RouteExternal points the router's route for prefix (inside ExternalCIDR or
// ExternalCIDR6, or one of them whole) at node n, the way a provider's load
// balancer or BGP would send external traffic to a node.
func (c *Cluster) RouteExternal(ctx context.Context, prefix string, n *Node) error {
	p, err := netip.ParsePrefix(prefix)
	if err != nil {
		return err
	}
	if p.Addr().Is6() {
		return nsutil.IP(ctx, c.Router, "-6", "route", "replace", prefix, "via", n.IP6)
	}
	return nsutil.IP(ctx, c.Router, "route", "replace", prefix, "via", n.IP)
}

func (c *Cluster) buildNode(ctx context.Context, n *Node) error {
	if err := c.addNamespace(ctx, n.Netns); err != nil {
		return err
	}
	if err := forwarding(n.Netns); err != nil {
		return err
	}
	for _, kv := range [][2]string{
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
	} {
		if err := nsutil.Sysctl(n.Netns, kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := c.plugIntoLAN(ctx, n.Netns, fmt.Sprintf("to-n%d", n.Index), nodeIP(n.Index), nodeIP6(n.Index)); err != nil {
		return err
	}
	if err := nsutil.IP(ctx, n.Netns, "link", "add", "cbr0", "type", "bridge"); err != nil {
		return err
	}
	if err := addrsUp(ctx, n.Netns, "cbr0", with24(podGateway(n.Index)), with64(podGateway6(n.Index))); err != nil {
		return err
	}
	for j := 1; j <= c.cfg.PodsPerNode; j++ {
		p := &Pod{
			Name:  fmt.Sprintf("%s-%d-%d", c.cfg.PodPrefix, n.Index, j),
			Netns: fmt.Sprintf("%s-n%dp%d", c.ID, n.Index, j),
			IP:    podIP(n.Index, j).String(),
			IP6:   podIP6(n.Index, j).String(),
			Node:  n,
		}
		n.Pods = append(n.Pods, p)
		if err := c.addNamespace(ctx, p.Netns); err != nil {
			return err
		}
		port := fmt.Sprintf("vp%d", j)
		if err := veth(ctx, n.Netns, port, p.Netns, "eth0"); err != nil {
			return err
		}
		if err := ipAll(ctx, n.Netns, [][]string{
			{"link", "set", port, "master", "cbr0"},
			{"link", "set", port, "type", "bridge_slave", "hairpin", "on"},
			{"link", "set", port, "up"},
		}); err != nil {
			return err
		}
		if err := addrsUp(ctx, p.Netns, "eth0", with24(podIP(n.Index, j)), with64(podIP6(n.Index, j))); err != nil {
			return err
		}
		if err := defaultRoutes(ctx, p.Netns, podGateway(n.Index), podGateway6(n.Index)); err != nil {
			return err
		}
	}
	return nil
}

// plugIntoLAN joins namespace name to the router's node-segment bridge with
// the given addresses and default routes via the router.
func (c *Cluster) plugIntoLAN(ctx context.Context, name, routerSide string, ip, ip6 netip.Addr) error {
	if err := veth(ctx, c.Router, routerSide, name, "eth0"); err != nil {
		return err
	}
	if err := ipAll(ctx, c.Router, [][]string{
		{"link", "set", routerSide, "master", "lan"},
		{"link", "set", routerSide, "up"},
	}); err != nil {
		return err
	}
	if err := addrsUp(ctx, name, "eth0", with24(ip), with64(ip6)); err != nil {
		return err
	}
	return defaultRoutes(ctx, name, routerNodeIP(), routerNodeIP6())
}

// veth creates a veth pair with one end in each of two namespaces.
func veth(ctx context.Context, aNS, aName, bNS, bName string) error {
	return nsutil.IP(ctx, aNS, "link", "add", aName, "type", "veth", "peer", "name", bName, "netns", bNS)
}

// addrsUp gives dev an IPv4 and an IPv6 address (no duplicate address
// detection: the address is usable at once) and sets it up.
func addrsUp(ctx context.Context, name, dev, v4, v6 string) error {
	return ipAll(ctx, name, [][]string{
		{"addr", "add", v4, "dev", dev},
		{"-6", "addr", "add", v6, "dev", dev, "nodad"},
		{"link", "set", dev, "up"},
	})
}

func defaultRoutes(ctx context.Context, name string, gw, gw6 netip.Addr) error {
	return ipAll(ctx, name, [][]string{
		{"route", "add", "default", "via", gw.String()},
		{"-6", "route", "add", "default", "via", gw6.String()},
	})
}

// routes adds prefix-via-gateway routes of either family.
func routes(ctx context.Context, name string, pairs [][2]string) error {
	for _, p := range pairs {
		if err := nsutil.IP(ctx, name, "route", "add", p[0], "via", p[1]); err != nil {
			return err
		}
	}
	return nil
}

func forwarding(name string) error {
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := nsutil.Sysctl(name, k, "1"); err != nil {
			return err
		}
	}
	return nil
}

func ipAll(ctx context.Context, name string, steps [][]string) error {
	for _, s := range steps {
		if err := nsutil.IP(ctx, name, s...); err != nil {
			return err
		}
	}
	return nil
}
