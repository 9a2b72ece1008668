package config

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

// NodePortAddresses is where NodePorts are served: the node's primary IPs
// (Primary, the default), or its local interface addresses inside CIDRs
// (0.0.0.0/0 and ::/0: every local address of the family), as kube-proxy.
type NodePortAddresses struct {
	Primary bool
	CIDRs   []netip.Prefix
}

// String is the value in --nodeport-addresses' syntax.
func (n *NodePortAddresses) String() string {
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
func parseNodePortAddresses(values []string) (*NodePortAddresses, error) {
	const name = "nodePortAddresses (--nodeport-addresses)"
	var out NodePortAddresses
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
	DetectLocalClusterCIDR = "ClusterCIDR"
	DetectLocalNodeCIDR    = "NodeCIDR"
)

// checkDetectLocalMode accepts ClusterCIDR (also ""), and NodeCIDR, and
// refuses kube-proxy's interface-based modes, which onehop's dataplanes
// cannot express.
func checkDetectLocalMode(mode string) error {
	const name = "detectLocalMode (--detect-local-mode)"
	switch mode {
	case "", DetectLocalClusterCIDR, DetectLocalNodeCIDR:
		return nil
	case "BridgeInterface", "InterfaceNamePrefix":
		return fmt.Errorf("%s %q is not supported: onehop's dataplanes tell local pod traffic by source address, "+
			"not by interface; use %s (with clusterCIDR) or %s (this Node's spec.podCIDRs)",
			name, mode, DetectLocalClusterCIDR, DetectLocalNodeCIDR)
	}
	return fmt.Errorf("%s %q: want %s or %s", name, mode, DetectLocalClusterCIDR, DetectLocalNodeCIDR)
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

// CheckClientRate refuses a negative QPS or burst towards the API server.
func CheckClientRate(qpsName, burstName string, qps float64, burst int) error {
	if qps < 0 || burst < 0 {
		return fmt.Errorf("%s and %s must not be negative", qpsName, burstName)
	}
	return nil
}

// CheckLogFormat accepts text and json.
func CheckLogFormat(name, f string) error {
	if f != "text" && f != "json" {
		return fmt.Errorf("%s %q: want text or json", name, f)
	}
	return nil
}

// ParseBalancing parses the cluster-wide default balancing: random or
// maglev (a Service's onehop.io/balancing annotation overrides it).
func ParseBalancing(v string) (portal.Balancing, error) {
	b, ok := portal.ParseBalancing(v)
	if !ok {
		return b, fmt.Errorf("balancing (--balancing) %q: want %s or %s", v, portal.BalancingRandom, portal.BalancingMaglev)
	}
	return b, nil
}

// ParsePrefixes parses a flag's comma-separated CIDRs, skipping blank
// entries; errors name the flag (flagName, without its dashes).
func ParsePrefixes(flagName, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("--%s: %q is not a CIDR", flagName, part)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// validate checks the merged settings, whether they came from flags or
// the file, with the same checks as the file's loader.
func (f *Settings) validate() error {
	if f.MasqueradeBit < 0 || f.MasqueradeBit > 31 {
		return fmt.Errorf("--masquerade-bit %d: must be 0..31", f.MasqueradeBit)
	}
	if f.Dataplane != "nft" && f.Dataplane != "ipvs" {
		return fmt.Errorf("--dataplane %q: must be nft or ipvs", f.Dataplane)
	}
	np, err := parseNodePortAddresses(strings.Split(f.NodePortAddrs, ","))
	if err != nil {
		return err
	}
	f.NodePorts = np
	if err := checkDetectLocalMode(f.DetectLocalMode); err != nil {
		return err
	}
	if err := f.Conntrack.validate(); err != nil {
		return err
	}
	if f.OOMScoreAdj < -1000 || f.OOMScoreAdj > 1000 {
		return fmt.Errorf("oomScoreAdj (--oom-score-adj) %d: want -1000 to 1000", f.OOMScoreAdj)
	}
	for _, c := range []struct{ flag, s string }{{"cluster-cidr", f.ClusterCIDR}, {"service-cidr", f.ServiceCIDR},
		{"external-ip-cidrs", f.ExternalIPCIDRs}} {
		if _, err := ParsePrefixes(c.flag, c.s); err != nil {
			return err
		}
	}
	cluster, _ := ParsePrefixes("cluster-cidr", f.ClusterCIDR)
	if err := checkClusterCIDRs("--cluster-cidr", cluster); err != nil {
		return err
	}
	if err := checkSyncPeriods("--sync-period", "--min-sync-period", f.SyncPeriod, f.MinSyncPeriod); err != nil {
		return err
	}
	if err := CheckClientRate("--kube-api-qps", "--kube-api-burst", f.QPS, f.Burst); err != nil {
		return err
	}
	if err := CheckLogFormat("--log-format", f.LogFormat); err != nil {
		return err
	}
	if _, err := ParseBalancing(f.Balancing); err != nil {
		return err
	}
	for _, a := range []struct {
		flag string
		addr *string
		port string
	}{{"--healthz-bind-address", &f.HealthzAddr, healthzPort}, {"--metrics-bind-address", &f.MetricsAddr, metricsPort}} {
		hp, err := hostPort(a.flag, *a.addr, a.port)
		if err != nil {
			return err
		}
		*a.addr = hp // a bare IP gets kube-proxy's port, as in the file
	}
	return nil
}
