package pressure

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// TestNodeAddressChange: node 1's InternalIP moves to another address of
// the node segment, as after a DHCP renumbering: the node's interface
// takes the new address and drops the old one, the router and the other
// node route node 1's pods to the new one, and the Node's status says so.
// A NodePort Service must then be served on the new address, to the
// external client, within netns.ConvergeTimeout.
func TestNodeAddressChange(t *testing.T) {
	c := newCluster(t, netns.Config{})
	n := c.Nodes[0]
	ctx := ctxFor(t)
	pods := c.Pods()
	svc := expose(t, c, "np", v1.ServiceTypeNodePort, pods)
	port := strconv.Itoa(int(svc.Spec.Ports[0].NodePort))
	oldIP, newIP := n.IP, "192.0.2.111"
	waitServed(ctx, t, c.ClientNetns, net.JoinHostPort(oldIP, port), pods, time.Now(), netns.ConvergeTimeout)

	moved := time.Now()
	renumber(ctx, t, c, n, newIP)
	d := waitServed(ctx, t, c.ClientNetns, net.JoinHostPort(newIP, port), pods, moved, netns.ConvergeTimeout)
	t.Logf("NodePort served on %s's new address %s %v after it began to move from %s", n.Name, newIP, d.Round(time.Millisecond), oldIP)
	if out, err := c.Nft(ctx, n, "list", "set", "inet", "onehop", "nodeport-ips4"); err == nil {
		t.Logf("the agent's NodePort addresses on %s now:\n%s", n.Name, out)
	}
	// And still through node 2, whose traffic to node 1's pods takes the
	// new route.
	waitServed(ctx, t, c.ClientNetns, net.JoinHostPort(c.Nodes[1].IP, port), pods, moved, netns.ConvergeTimeout)
}

// renumber moves node n's IPv4 address on the node segment to ip: the
// interface, the routes to its pods on the router and the other nodes,
// and its Node's InternalIP.
func renumber(ctx context.Context, t *testing.T, c *netns.Cluster, n *netns.Node, ip string) {
	t.Helper()
	// The new address is a secondary of the same /24 until the old one
	// goes; promoted then, instead of going with it.
	if err := nsutil.Sysctl(n.Netns, "net.ipv4.conf.eth0.promote_secondaries", "1"); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		netns string
		args  []string
	}{
		{n.Netns, []string{"addr", "add", ip + "/24", "dev", "eth0"}},
		{n.Netns, []string{"addr", "del", n.IP + "/24", "dev", "eth0"}},
		{n.Netns, []string{"route", "replace", "default", "via", "192.0.2.1"}},
		{c.Router, []string{"route", "replace", n.PodCIDR, "via", ip}},
	}
	for _, m := range c.Nodes {
		if m != n {
			steps = append(steps, struct {
				netns string
				args  []string
			}{m.Netns, []string{"route", "replace", n.PodCIDR, "via", ip}})
		}
	}
	for _, s := range steps {
		if err := nsutil.IP(ctx, s.netns, s.args...); err != nil {
			t.Fatal(err)
		}
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range node.Status.Addresses {
		if a.Type == v1.NodeInternalIP && a.Address == n.IP {
			node.Status.Addresses[i].Address = ip
		}
	}
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.IP = ip
}
