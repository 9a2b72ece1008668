package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// runDemo creates the LoadBalancer Service, sends requests from the external
// client and prints what happened, the conntrack entry and the agent's rules.
func runDemo(ctx context.Context, c *netns.Cluster) (string, error) {
	node := c.Nodes[0]
	ingress := netns.ExternalIP(10).String()
	step(fmt.Sprintf("Creating Service hello (type LoadBalancer, externalTrafficPolicy Local, port 80 -> 8080) with load-balancer IP %s,\n    backed by the pods %s; the router sends %s to %s (%s)",
		ingress, podNames(c.Pods()), ingress, node.Name, node.IP))
	svc, err := c.CreateService(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: metav1.NamespaceDefault},
		Spec: v1.ServiceSpec{
			Type:                  v1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal,
			Selector:              map[string]string{"app": "hello"},
			Ports:                 []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(netns.PortHTTP)}},
		},
	})
	if err != nil {
		return "", err
	}
	if err := c.SetEndpoints(ctx, svc, netns.Ready(c.Pods()...)); err != nil {
		return "", err
	}
	if _, err := c.SetLoadBalancerIngress(ctx, svc, ingress); err != nil {
		return "", err
	}
	written := time.Now()
	addr := net.JoinHostPort(ingress, "80")
	_, d, err := netns.WaitAnswer(ctx, c.ClientNetns, "tcp", addr, written)
	if err != nil {
		return "", err
	}
	fmt.Printf("   traffic followed the API %v after the status write\n", d.Round(time.Millisecond))

	step(fmt.Sprintf("Requests from the external client %s (netns %s) to %s", netns.ClientIP(), c.ClientNetns, addr))
	kept := true
	var seen string
	for i := 0; i < 4; i++ {
		rep, err := nsutil.Request(ctx, c.ClientNetns, "tcp", addr)
		if err != nil {
			return "", err
		}
		fmt.Printf("   answered by pod %-10s on %s, which saw the request come from %s\n", rep.Name, nodeOf(c, rep.Name), rep.Source)
		if rep.SourceIP() != netns.ClientIP().String() {
			kept, seen = false, rep.SourceIP()
		}
	}
	if kept {
		fmt.Printf("   -> the pods saw the client's own address %s: no SNAT, one DNAT straight to the pod.\n", netns.ClientIP())
	} else {
		fmt.Printf("   -> a pod saw %s, not the client's %s: the node masqueraded the connection, so the\n"+
			"      agent does not honor externalTrafficPolicy: Local (which keeps the client's address) yet.\n", seen, netns.ClientIP())
	}

	step(fmt.Sprintf("conntrack on %s: each connection is one entry, destination %s rewritten to a pod IP (the one hop)", node.Name, ingress))
	if out, err := nsutil.Exec(ctx, node.Netns, "conntrack", "-L", "-p", "tcp", "-d", ingress); err == nil {
		fmt.Print(indent(out))
	} else {
		fmt.Printf("   (conntrack unavailable: %v)\n", err)
	}

	var b strings.Builder
	for _, format := range []string{"table", "nft"} {
		out, err := c.DumpRules(ctx, node, format)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\n==> agent dump-rules -o %s  (in %s, the kernel's state)\n%s", format, node.Name, indent(out))
	}
	return b.String(), nil
}

func nodeOf(c *netns.Cluster, pod string) string {
	for _, p := range c.Pods() {
		if p.Name == pod {
			return p.Node.Name
		}
	}
	return "?"
}

func podNames(pods []*netns.Pod) string {
	var s []string
	for _, p := range pods {
		s = append(s, fmt.Sprintf("%s (%s on %s)", p.Name, p.IP, p.Node.Name))
	}
	return strings.Join(s, ", ")
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("   " + l + "\n")
	}
	return b.String()
}
