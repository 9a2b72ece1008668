package difftest

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// buildTopology wires a twin's namespaces the way test/netns wires its
// cluster, dual-stack: a router bridging the node segment and joined to the
// outside client, the control plane and the nodes on the node segment, each
// node a bridge with its pods, direct routes between nodes' pod CIDRs, and
// the external range routed to node 1.
func (tw *Twin) buildTopology(ctx context.Context) error {
	tw.Router, tw.ClientNS, tw.ControlNS = tw.ID+"-rt", tw.ID+"-cl", tw.ID+"-cp"
	for _, ns := range []string{tw.Router, tw.ClientNS, tw.ControlNS} {
		if err := tw.addNamespace(ctx, ns); err != nil {
			return err
		}
	}
	if err := forward(tw.Router); err != nil {
		return err
	}
	if err := ipSteps(ctx, tw.Router, [][]string{{"link", "add", "lan", "type", "bridge"}}); err != nil {
		return err
	}
	if err := upWith(ctx, tw.Router, "lan", routerIP(), routerIP6()); err != nil {
		return err
	}
	if err := pair(ctx, tw.Router, "to-client", tw.ClientNS, "eth0"); err != nil {
		return err
	}
	if err := upWith(ctx, tw.Router, "to-client", routerClientSideIP(), routerClientSideIP6()); err != nil {
		return err
	}
	if err := upWith(ctx, tw.ClientNS, "eth0", netns.ClientIP(), clientIP6()); err != nil {
		return err
	}
	if err := gateways(ctx, tw.ClientNS, routerClientSideIP(), routerClientSideIP6()); err != nil {
		return err
	}
	if err := tw.onLAN(ctx, tw.ControlNS, "to-cp", netns.ControlPlaneIP(), controlPlaneIP6()); err != nil {
		return err
	}
	for n := 1; n <= nodes; n++ {
		if err := tw.buildNode(ctx, n); err != nil {
			return fmt.Errorf("%s: %w", nodeName(n), err)
		}
	}
	for n := 1; n <= nodes; n++ {
		var steps [][]string
		for m := 1; m <= nodes; m++ {
			if m != n {
				steps = append(steps,
					[]string{"route", "add", podCIDR(m).String(), "via", nodeIP(m).String()},
					[]string{"-6", "route", "add", podCIDR6(m).String(), "via", nodeIP6(m).String()})
			}
		}
		if err := ipSteps(ctx, tw.node(n).Netns, steps); err != nil {
			return err
		}
		if err := ipSteps(ctx, tw.Router, [][]string{
			{"route", "add", podCIDR(n).String(), "via", nodeIP(n).String()},
			{"-6", "route", "add", podCIDR6(n).String(), "via", nodeIP6(n).String()},
		}); err != nil {
			return err
		}
	}
	return ipSteps(ctx, tw.Router, [][]string{
		{"route", "add", netns.ExternalCIDR, "via", nodeIP(1).String()},
		{"-6", "route", "add", netns.ExternalCIDR6, "via", nodeIP6(1).String()},
	})
}

func (tw *Twin) buildNode(ctx context.Context, n int) error {
	node := &Node{Index: n, Name: nodeName(n), Netns: fmt.Sprintf("%s-n%d", tw.ID, n)}
	tw.Nodes = append(tw.Nodes, node)
	if err := tw.addNamespace(ctx, node.Netns); err != nil {
		return err
	}
	if err := forward(node.Netns); err != nil {
		return err
	}
	for _, kv := range [][2]string{
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
	} {
		if err := nsutil.Sysctl(node.Netns, kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := noICMPRateLimit(node.Netns); err != nil {
		return err
	}
	if err := tw.onLAN(ctx, node.Netns, fmt.Sprintf("to-n%d", n), nodeIP(n), nodeIP6(n)); err != nil {
		return err
	}
	if err := ipSteps(ctx, node.Netns, [][]string{{"link", "add", "cbr0", "type", "bridge"}}); err != nil {
		return err
	}
	if err := upWith(ctx, node.Netns, "cbr0", bridgeIP(n), bridgeIP6(n)); err != nil {
		return err
	}
	for j := 1; j <= podsPerNode; j++ {
		p := &Pod{Ref: podRef{n, j}, Netns: fmt.Sprintf("%s-n%dp%d", tw.ID, n, j)}
		node.Pods = append(node.Pods, p)
		if err := tw.addNamespace(ctx, p.Netns); err != nil {
			return err
		}
		if err := noICMPRateLimit(p.Netns); err != nil {
			return err
		}
		port := fmt.Sprintf("vp%d", j)
		if err := pair(ctx, node.Netns, port, p.Netns, "eth0"); err != nil {
			return err
		}
		// Hairpin on: a pod reaches itself through a Service.
		if err := ipSteps(ctx, node.Netns, [][]string{
			{"link", "set", port, "master", "cbr0"},
			{"link", "set", port, "type", "bridge_slave", "hairpin", "on"},
			{"link", "set", port, "up"},
		}); err != nil {
			return err
		}
		if err := upWith(ctx, p.Netns, "eth0", p.Ref.IP(), p.Ref.IP6()); err != nil {
			return err
		}
		if err := gateways(ctx, p.Netns, bridgeIP(n), bridgeIP6(n)); err != nil {
			return err
		}
	}
	return nil
}

// onLAN joins namespace ns to the router's node-segment bridge.
func (tw *Twin) onLAN(ctx context.Context, ns, routerSide string, ip, ip6 netip.Addr) error {
	if err := pair(ctx, tw.Router, routerSide, ns, "eth0"); err != nil {
		return err
	}
	if err := ipSteps(ctx, tw.Router, [][]string{
		{"link", "set", routerSide, "master", "lan"},
		{"link", "set", routerSide, "up"},
	}); err != nil {
		return err
	}
	if err := upWith(ctx, ns, "eth0", ip, ip6); err != nil {
		return err
	}
	return gateways(ctx, ns, routerIP(), routerIP6())
}

// registerNodes writes a Node per node namespace as its kubelet would:
// labels, pod CIDRs, and a Ready status with both InternalIPs.
func (tw *Twin) registerNodes(ctx context.Context) error {
	for _, n := range tw.Nodes {
		node := &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
				"kubernetes.io/hostname":        n.Name,
				"kubernetes.io/os":              "linux",
				"topology.kubernetes.io/zone":   nodeZone(n.Index),
				"topology.kubernetes.io/region": "test",
			}},
			Spec: v1.NodeSpec{PodCIDR: podCIDR(n.Index).String(), PodCIDRs: []string{podCIDR(n.Index).String(), podCIDR6(n.Index).String()}},
		}
		created, err := tw.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("register %s: %w", n.Name, err)
		}
		now := metav1.Now()
		created.Status = v1.NodeStatus{
			Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: nodeIP(n.Index).String()},
				{Type: v1.NodeInternalIP, Address: nodeIP6(n.Index).String()},
				{Type: v1.NodeHostName, Address: n.Name},
			},
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: now, LastTransitionTime: now}},
		}
		if _, err := tw.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("status of %s: %w", n.Name, err)
		}
	}
	return nil
}

func pair(ctx context.Context, aNS, aName, bNS, bName string) error {
	return nsutil.IP(ctx, aNS, "link", "add", aName, "type", "veth", "peer", "name", bName, "netns", bNS)
}

// upWith gives dev an IPv4 /24 and an IPv6 /64 (usable at once: no
// duplicate address detection) and sets it up.
func upWith(ctx context.Context, ns, dev string, ip, ip6 netip.Addr) error {
	return ipSteps(ctx, ns, [][]string{
		{"addr", "add", with24(ip), "dev", dev},
		{"-6", "addr", "add", with64(ip6), "dev", dev, "nodad"},
		{"link", "set", dev, "up"},
	})
}

func gateways(ctx context.Context, ns string, gw, gw6 netip.Addr) error {
	return ipSteps(ctx, ns, [][]string{
		{"route", "add", "default", "via", gw.String()},
		{"-6", "route", "add", "default", "via", gw6.String()},
	})
}

// noICMPRateLimit lifts the kernel's ICMP rate limits in ns. kube-proxy
// refuses TCP with ICMP port unreachable on the nodes, and a pod refuses
// a port it does not serve (a Service's target port) the same way; the
// kernel otherwise limits such errors per client (a burst of 6, then 1 a
// second), so that whether a probe saw "refused" or "timeout" would depend
// on how many probes, of this case or of the cases before, went before it
// (docs/difftest.md).
func noICMPRateLimit(ns string) error {
	for _, kv := range [][2]string{
		{"net.ipv4.icmp_ratelimit", "0"},
		{"net.ipv4.icmp_msgs_per_sec", "100000"},
		{"net.ipv4.icmp_msgs_burst", "100000"},
		{"net.ipv6.icmp.ratelimit", "0"},
	} {
		if err := nsutil.Sysctl(ns, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

func forward(ns string) error {
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := nsutil.Sysctl(ns, k, "1"); err != nil {
			return err
		}
	}
	return nil
}

func ipSteps(ctx context.Context, ns string, steps [][]string) error {
	for _, s := range steps {
		if err := nsutil.IP(ctx, ns, s...); err != nil {
			return err
		}
	}
	return nil
}
