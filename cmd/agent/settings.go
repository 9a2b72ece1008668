package main

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/onehop/onehop/portal"
)

// The checks below are shared by the flags and the --config file, so that
// both accept the same values; their errors name the file's field and the
// flag.

// nodePortAddressesPrimary is nodePortAddresses' special value: the node's
// primary IPs, from its Node object.
const nodePortAddressesPrimary = "primary"

// nodePortAddresses is where NodePorts are served: the node's primary IPs
// (Primary, the default), or its local interface addresses inside CIDRs
// (0.0.0.0/0 and ::/0: every local address of the family), as kube-proxy.
type nodePortAddresses struct {
	Primary bool
	CIDRs   []netip.Prefix
}

// String is the value in --nodeport-addresses' syntax.
func (n *nodePortAddresses) String() string {
	if n == nil || n.Primary {
		return nodePortAddressesPrimary
	}
	s := make([]string, len(n.CIDRs))
	for i, p := range n.CIDRs {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// parseNodePortAddresses checks nodePortAddresses (or the flag's
// comma-separated list): "primary" alone, or CIDRs. Blank entries are
// skipped; none at all means primary.
func parseNodePortAddresses(values []string) (*nodePortAddresses, error) {
	const name = "nodePortAddresses (--nodeport-addresses)"
	var out nodePortAddresses
	n := 0
	for _, v := range values {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		n++
		if v == nodePortAddressesPrimary {
			out.Primary = true
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a CIDR (want CIDRs, or %q alone)", name, v, nodePortAddressesPrimary)
		}
		out.CIDRs = append(out.CIDRs, p.Masked())
	}
	if out.Primary && n > 1 {
		return nil, fmt.Errorf("%s: %q cannot be combined with CIDRs", name, nodePortAddressesPrimary)
	}
	if n == 0 {
		out.Primary = true
	}
	return &out, nil
}

// The detectLocalMode values onehop applies.
const (
	detectLocalClusterCIDR = "ClusterCIDR"
	detectLocalNodeCIDR    = "NodeCIDR"
)

// checkDetectLocalMode accepts ClusterCIDR (also ""), and NodeCIDR, and
// refuses kube-proxy's interface-based modes, which onehop's dataplanes
// cannot express.
func checkDetectLocalMode(mode string) error {
	const name = "detectLocalMode (--detect-local-mode)"
	switch mode {
	case "", detectLocalClusterCIDR, detectLocalNodeCIDR:
		return nil
	case "BridgeInterface", "InterfaceNamePrefix":
		return fmt.Errorf("%s %q is not supported: onehop's dataplanes tell local pod traffic by source address, "+
			"not by interface; use %s (with clusterCIDR) or %s (this Node's spec.podCIDRs)",
			name, mode, detectLocalClusterCIDR, detectLocalNodeCIDR)
	}
	return fmt.Errorf("%s %q: want %s or %s", name, mode, detectLocalClusterCIDR, detectLocalNodeCIDR)
}

// checkClusterCIDRs accepts one pod CIDR, or two of different IP families.
func checkClusterCIDRs(name string, ps []netip.Prefix) error {
	if len(ps) > 2 || (len(ps) == 2 && ps[0].Addr().Is4() == ps[1].Addr().Is4()) {
		return fmt.Errorf("%s %v: want one CIDR, or two of different IP families", name, ps)
	}
	return nil
}

// checkSyncPeriods refuses negative periods and a minimum above the maximum.
func checkSyncPeriods(syncName, minName string, sync, minSync time.Duration) error {
	if sync < 0 || minSync < 0 {
		return fmt.Errorf("%s and %s must not be negative", syncName, minName)
	}
	if sync > 0 && minSync > sync {
		return fmt.Errorf("%s %v is longer than %s %v", minName, minSync, syncName, sync)
	}
	return nil
}

// checkClientRate refuses a negative QPS or burst towards the API server.
func checkClientRate(qpsName, burstName string, qps float64, burst int) error {
	if qps < 0 || burst < 0 {
		return fmt.Errorf("%s and %s must not be negative", qpsName, burstName)
	}
	return nil
}

// checkLogFormat accepts text and json.
func checkLogFormat(name, f string) error {
	if f != "text" && f != "json" {
		return fmt.Errorf("%s %q: want text or json", name, f)
	}
	return nil
}

// parseBalancing parses the cluster-wide default balancing: random or
// maglev (a Service's onehop.io/balancing annotation overrides it).
func parseBalancing(v string) (portal.Balancing, error) {
	b, ok := portal.ParseBalancing(v)
	if !ok {
		return b, fmt.Errorf("balancing (--balancing) %q: want %s or %s", v, portal.BalancingRandom, portal.BalancingMaglev)
	}
	return b, nil
}
