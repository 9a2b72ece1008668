package config

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/l2"
)

// ForNode is the configuration one node runs (node is nil when its Node
// object is not known): the BGP peers whose nodeSelector picks it, with
// its own router ID and next hops read from its Node; the L2 responder
// when an L2Advertisement picks it (or, with none, as the file says), on
// the interfaces the advertisements that pick it name. The controller runs
// cfg as it is: it announces nothing.
func (c *Converted) ForNode(node *corev1.Node) Config {
	cfg := c.Config
	ads := c.ads
	cfg.ads = &ads
	var nl labels.Set
	if node != nil {
		nl = node.Labels
	}
	var sel []bgp.Peer
	for _, p := range c.Peers {
		if p.nodes == nil || p.nodes.Matches(nl) {
			sel = append(sel, p.peer)
		}
	}
	switch {
	case len(sel) > 0 && c.Config.BGP != nil:
		b := *c.Config.BGP
		b.Peers = append(slices.Clone(b.Peers), sel...)
		cfg.BGP = &b
	case len(sel) > 0:
		ref := c.Peers[0]
		b := bgp.Config{ASN: ref.asn, Peers: sel}
		var errs [3]error
		b.RouterID, errs[0] = nodeValue(node, ref.routerID, false, "routerID")
		b.NextHopIPv4, errs[1] = nodeValue(node, ref.nextHop4, false, "nextHopIPv4")
		b.NextHopIPv6, errs[2] = nodeValue(node, ref.nextHop6, true, "nextHopIPv6")
		cfg.BGP, cfg.bgpErr = &b, errors.Join(errs[:]...)
	}
	if len(c.ads.L2) > 0 {
		cfg.L2 = nil
		var ifaces, patterns []string
		picked := false
		for i := range c.ads.L2 {
			a := &c.ads.L2[i]
			if !a.selectsNode(nl) {
				continue
			}
			picked = true
			ifaces = append(ifaces, a.Interfaces...)
			if a.Pattern != "" {
				patterns = append(patterns, a.Pattern)
			}
		}
		if picked {
			var l l2.Config
			if c.Config.L2 != nil {
				l = *c.Config.L2
			}
			if len(ifaces)+len(patterns) > 0 {
				slices.Sort(ifaces)
				l.Interfaces = slices.Compact(ifaces)
			}
			cfg.L2, cfg.l2Patterns = &l, patterns
		}
	}
	return cfg
}

// nodeValue reads an address of the family wanted from node, as nv says
// (empty when nv is nil: the speaker's default).
func nodeValue(node *corev1.Node, nv *v1alpha1.NodeValue, want6 bool, field string) (string, error) {
	if nv == nil {
		return "", nil
	}
	if node == nil {
		return "", fmt.Errorf("bgp: %s: this node's Node object is not known", field)
	}
	var s, from string
	switch {
	case nv.Annotation != "":
		s, from = node.Annotations[nv.Annotation], "annotation "+nv.Annotation
	case nv.Label != "":
		s, from = node.Labels[nv.Label], "label "+nv.Label
	default:
		for _, a := range node.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil && string(a.Type) == nv.AddressType && ip.Is6() == want6 {
				return ip.String(), nil
			}
		}
		return "", fmt.Errorf("bgp: %s: node %s has no %s of the family", field, node.Name, nv.AddressType)
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return "", fmt.Errorf("bgp: %s: node %s's %s is %q, not an IP address", field, node.Name, from, s)
	}
	if ip.Is6() != want6 {
		return "", fmt.Errorf("bgp: %s: node %s's %s is %s, of the wrong family", field, node.Name, from, ip)
	}
	return ip.String(), nil
}
