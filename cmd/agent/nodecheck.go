package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// nodeCheck makes a wrong node name visible. Without this node's Node
// object the agent serves no NodePorts, has no local endpoints and answers
// 503 on /healthz; a name that is not the Node's (an FQDN for a short
// name, say) is logged as an error, with the Nodes the name may have
// meant, until the Node shows up, and onehop_node_found says so.
type nodeCheck struct {
	name   string
	client kubernetes.Interface
	log    *slog.Logger
	found  prometheus.Gauge
	// every is how often a missing Node is looked for and logged again.
	every time.Duration
}

func newNodeCheck(name string, client kubernetes.Interface, log *slog.Logger, reg prometheus.Registerer) *nodeCheck {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "onehop_node_found",
		Help: "1 when the Node object named by --hostname-override (or the hostname) exists, 0 while it is missing."})
	if reg != nil {
		reg.MustRegister(g)
	}
	return &nodeCheck{name: name, client: client, log: log, found: g, every: 30 * time.Second}
}

// run checks, until ctx ends, that current (the informer's view of this
// node's Node) has it. Call it once the informers have synced.
func (c *nodeCheck) run(ctx context.Context, current func() *v1.Node) {
	missing := false
	for {
		if current() != nil {
			c.found.Set(1)
			if missing {
				c.log.InfoContext(ctx, "this node's Node object is there now", "node", c.name)
			}
			missing = false
		} else {
			c.found.Set(0)
			missing = true
			c.reportMissing(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.every):
		}
	}
}

// reportMissing logs that the Node is not there, with the Nodes the name
// may have meant.
func (c *nodeCheck) reportMissing(ctx context.Context) {
	msg := "no Node object named as this node: no NodePorts, no local endpoints and /healthz 503 until it exists; " +
		"set --hostname-override (hostnameOverride) to the Node's name"
	attrs := []any{"node", c.name}
	list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		attrs = append(attrs, "list_nodes_err", err)
	} else if hints := nodeNameHints(c.name, list.Items); len(hints) > 0 {
		attrs = append(attrs, "did_you_mean", strings.Join(hints, ","))
	}
	c.log.ErrorContext(ctx, msg, attrs...)
}

// nodeNameHints returns the Nodes name may mean: the same first DNS label
// (an FQDN for a short name or the reverse), or a Node whose hostname
// label or a hostname/DNS address is name.
func nodeNameHints(name string, nodes []v1.Node) []string {
	short := func(s string) string {
		if _, err := netip.ParseAddr(s); err == nil {
			return s
		}
		first, _, _ := strings.Cut(s, ".")
		return first
	}
	var out []string
	for _, n := range nodes {
		match := short(n.Name) == short(name) || n.Labels[v1.LabelHostname] == name
		for _, a := range n.Status.Addresses {
			if strings.EqualFold(a.Address, name) && a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
				match = true
			}
		}
		if match && n.Name != name && !slices.Contains(out, n.Name) {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out
}

// waitForPodCIDRs returns this Node's spec.podCIDRs for detectLocalMode
// NodeCIDR, waiting (as kube-proxy does) until the Node exists and has
// them, and logging why it waits.
func (c *nodeCheck) waitForPodCIDRs(ctx context.Context) ([]netip.Prefix, error) {
	logged := time.Time{}
	for {
		n, err := c.client.CoreV1().Nodes().Get(ctx, c.name, metav1.GetOptions{})
		switch {
		case err == nil && len(nodePodCIDRs(n)) > 0:
			return parsePodCIDRs(n)
		case time.Since(logged) < c.every:
		case apierrors.IsNotFound(err):
			c.reportMissing(ctx)
			logged = time.Now()
		case err != nil:
			c.log.ErrorContext(ctx, "detectLocalMode NodeCIDR: cannot read this node's Node; retrying", "node", c.name, "err", err)
			logged = time.Now()
		default:
			c.log.InfoContext(ctx, "detectLocalMode NodeCIDR: waiting for this Node's spec.podCIDRs", "node", c.name)
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(time.Second):
		}
	}
}

func nodePodCIDRs(n *v1.Node) []string {
	if len(n.Spec.PodCIDRs) > 0 {
		return n.Spec.PodCIDRs
	}
	if n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return nil
}

func parsePodCIDRs(n *v1.Node) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range nodePodCIDRs(n) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("detectLocalMode NodeCIDR: Node %s has spec.podCIDRs %q: %w", n.Name, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// podCIDRsChanged returns an error when the Node's podCIDRs are no longer
// those the dataplane was built with: kube-proxy exits then, to restart
// with the new ones.
func podCIDRsChanged(n *v1.Node, using []netip.Prefix) error {
	if n == nil {
		return nil
	}
	now, err := parsePodCIDRs(n)
	if err != nil || len(now) == 0 {
		return nil
	}
	if !slices.Equal(now, using) {
		return fmt.Errorf("detectLocalMode NodeCIDR: Node %s's spec.podCIDRs changed from %v to %v; exiting to restart with them",
			n.Name, using, now)
	}
	return nil
}
