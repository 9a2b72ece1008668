package netns

import (
	"context"
	"fmt"

	"github.com/onehop/onehop/test/netns/ns"
)

// buildTopology creates the router, client, control-plane, node and pod
// namespaces and wires them (see the package doc for the plan).
func (c *Cluster) buildTopology(ctx context.Context) error {
	c.Router = c.ID + "-rt"
	c.ClientNetns = c.ID + "-cl"
	c.ControlNS = c.ID + "-cp"

	// Router: a bridge for the node segment, a veth to the client.
	if err := c.addNamespace(ctx, c.Router); err != nil {
		return err
	}
	if err := ns.Sysctl(c.Router, "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	steps := [][]string{
		{"link", "add", "lan", "type", "bridge"},
		{"addr", "add", with24(routerNodeIP()), "dev", "lan"},
		{"link", "set", "lan", "up"},
	}
	if err := ipAll(ctx, c.Router, steps); err != nil {
		return err
	}

	if err := c.addNamespace(ctx, c.ClientNetns); err != nil {
		return err
	}
	if err := veth(ctx, c.Router, "to-client", c.ClientNetns, "eth0"); err != nil {
		return err
	}
	if err := ipAll(ctx, c.Router, [][]string{
		{"addr", "add", with24(routerClientIP()), "dev", "to-client"},
		{"link", "set", "to-client", "up"},
	}); err != nil {
		return err
	}
	if err := ipAll(ctx, c.ClientNetns, [][]string{
		{"addr", "add", with24(ClientIP()), "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", routerClientIP().String()},
	}); err != nil {
		return err
	}

	// Control plane on the node segment.
	if err := c.addNamespace(ctx, c.ControlNS); err != nil {
		return err
	}
	if err := c.plugIntoLAN(ctx, c.ControlNS, "to-cp", ControlPlaneIP().String()); err != nil {
		return err
	}

	for i := 1; i <= c.cfg.Nodes; i++ {
		n := &Node{
			Index:   i,
			Name:    fmt.Sprintf("node-%d", i),
			Netns:   fmt.Sprintf("%s-n%d", c.ID, i),
			IP:      nodeIP(i).String(),
			PodCIDR: podCIDR(i).String(),
			Zone:    fmt.Sprintf("zone-%c", 'a'+(i-1)%26),
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
			if m != n {
				if err := ns.IP(ctx, n.Netns, "route", "add", m.PodCIDR, "via", m.IP); err != nil {
					return err
				}
			}
		}
		if err := ns.IP(ctx, c.Router, "route", "add", n.PodCIDR, "via", n.IP); err != nil {
			return err
		}
	}
	return c.RouteExternal(ctx, ExternalCIDR, c.Nodes[0])
}

// RouteExternal points the router's route for prefix (inside ExternalCIDR,
// or ExternalCIDR itself) at node n, the way a provider's load balancer or
// BGP would send external traffic to a node.
func (c *Cluster) RouteExternal(ctx context.Context, prefix string, n *Node) error {
	return ns.IP(ctx, c.Router, "route", "replace", prefix, "via", n.IP)
}

func (c *Cluster) buildNode(ctx context.Context, n *Node) error {
	if err := c.addNamespace(ctx, n.Netns); err != nil {
		return err
	}
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
	} {
		if err := ns.Sysctl(n.Netns, kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := c.plugIntoLAN(ctx, n.Netns, fmt.Sprintf("to-n%d", n.Index), n.IP); err != nil {
		return err
	}
	if err := ipAll(ctx, n.Netns, [][]string{
		{"link", "add", "cbr0", "type", "bridge"},
		{"addr", "add", with24(podGateway(n.Index)), "dev", "cbr0"},
		{"link", "set", "cbr0", "up"},
	}); err != nil {
		return err
	}
	for j := 1; j <= c.cfg.PodsPerNode; j++ {
		p := &Pod{
			Name:  fmt.Sprintf("%s-%d-%d", c.cfg.PodPrefix, n.Index, j),
			Netns: fmt.Sprintf("%s-n%dp%d", c.ID, n.Index, j),
			IP:    podIP(n.Index, j).String(),
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
		if err := ipAll(ctx, p.Netns, [][]string{
			{"addr", "add", with24(podIP(n.Index, j)), "dev", "eth0"},
			{"link", "set", "eth0", "up"},
			{"route", "add", "default", "via", podGateway(n.Index).String()},
		}); err != nil {
			return err
		}
	}
	return nil
}

// plugIntoLAN joins namespace name to the router's node-segment bridge with
// address ip and a default route via the router.
func (c *Cluster) plugIntoLAN(ctx context.Context, name, routerSide, ip string) error {
	if err := veth(ctx, c.Router, routerSide, name, "eth0"); err != nil {
		return err
	}
	if err := ipAll(ctx, c.Router, [][]string{
		{"link", "set", routerSide, "master", "lan"},
		{"link", "set", routerSide, "up"},
	}); err != nil {
		return err
	}
	return ipAll(ctx, name, [][]string{
		{"addr", "add", ip + "/24", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", routerNodeIP().String()},
	})
}

// veth creates a veth pair with one end in each of two namespaces.
func veth(ctx context.Context, aNS, aName, bNS, bName string) error {
	return ns.IP(ctx, aNS, "link", "add", aName, "type", "veth", "peer", "name", bName, "netns", bNS)
}

func ipAll(ctx context.Context, name string, steps [][]string) error {
	for _, s := range steps {
		if err := ns.IP(ctx, name, s...); err != nil {
			return err
		}
	}
	return nil
}
