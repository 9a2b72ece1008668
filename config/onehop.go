package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	extconfig "github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/portal"
)

// onehopConfiguration is onehop's own kind, allowed beside a
// KubeProxyConfiguration in the same file (as a second YAML document):
//
//	apiVersion: onehop.io/v1alpha1
//	kind: OnehopConfiguration
//	dataplane: nftables          # or nft, or ipvs; overrides the kube-proxy mode
//	externalIPCIDRs: [203.0.113.0/24]
//	serviceProxyName: ""         # handle Services labelled service.kubernetes.io/service-proxy-name=<this>
//	sourceRangesOnNodePorts: false
//	balancing: random            # or maglev: the default of Services without onehop.io/balancing
//	serviceLimits: {ports: 5000, sourceRanges: 10000, externalIPs: 100, loadBalancerIPs: 100}
//	external: {...}              # the cloud hook's settings, decoded by package external
type onehopConfiguration struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	Dataplane               string          `json:"dataplane,omitempty"`
	ExternalIPCIDRs         []string        `json:"externalIPCIDRs,omitempty"`
	ServiceProxyName        *string         `json:"serviceProxyName,omitempty"`
	SourceRangesOnNodePorts *bool           `json:"sourceRangesOnNodePorts,omitempty"`
	Balancing               string          `json:"balancing,omitempty"`
	ServiceLimits           *serviceLimits  `json:"serviceLimits,omitempty"`
	External                json.RawMessage `json:"external,omitempty"`
}

// serviceLimits bound what one Service may put into every node's ruleset
// (portal.Limits); a field left out keeps its default. kube-proxy has no
// such limits.
type serviceLimits struct {
	Ports           *int32 `json:"ports,omitempty"`
	SourceRanges    *int32 `json:"sourceRanges,omitempty"`
	ExternalIPs     *int32 `json:"externalIPs,omitempty"`
	LoadBalancerIPs *int32 `json:"loadBalancerIPs,omitempty"`
}

// resolve checks the limits given and returns them; zero fields of the
// result take portal's defaults.
func (sl *serviceLimits) resolve() (portal.Limits, error) {
	var l portal.Limits
	if sl == nil {
		return l, nil
	}
	for _, f := range []struct {
		name string
		v    *int32
		dst  *int
	}{{"ports", sl.Ports, &l.Ports}, {"sourceRanges", sl.SourceRanges, &l.SourceRanges},
		{"externalIPs", sl.ExternalIPs, &l.ExternalIPs}, {"loadBalancerIPs", sl.LoadBalancerIPs, &l.LoadBalancerIPs}} {
		if f.v == nil {
			continue
		}
		if *f.v < 1 {
			return l, fmt.Errorf("serviceLimits.%s %d: want at least 1 (leave it out for the default)", f.name, *f.v)
		}
		*f.dst = int(*f.v)
	}
	return l, nil
}

// applyOnehop resolves the OnehopConfiguration.
func (fc *File) applyOnehop(oh *onehopConfiguration) error {
	fc.OnehopFound = true
	switch oh.Dataplane {
	case "":
	case DataplaneNFTables, "nftables":
		fc.Dataplane = ptrTo(DataplaneNFTables)
	case DataplaneIPVS:
		fc.Dataplane = ptrTo(DataplaneIPVS)
	default:
		return fmt.Errorf("dataplane %q: want nftables (or nft) or ipvs", oh.Dataplane)
	}
	for _, s := range oh.ExternalIPCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("externalIPCIDRs: %q is not a CIDR: %w", s, err)
		}
		fc.ExternalIPCIDRs = append(fc.ExternalIPCIDRs, p.Masked())
	}
	if oh.ExternalIPCIDRs != nil && fc.ExternalIPCIDRs == nil {
		fc.ExternalIPCIDRs = []netip.Prefix{} // set, to none: deny all externalIPs
	}
	fc.ServiceProxyName = oh.ServiceProxyName
	fc.SourceRangesOnNodePorts = oh.SourceRangesOnNodePorts
	if oh.Balancing != "" {
		if _, err := ParseBalancing(oh.Balancing); err != nil {
			return err
		}
		fc.Balancing = &oh.Balancing
	}
	limits, err := oh.ServiceLimits.resolve()
	if err != nil {
		return err
	}
	fc.ServiceLimits = limits
	if len(oh.External) > 0 && !bytes.Equal(oh.External, []byte("null")) {
		if oh.External[0] != '{' {
			return fmt.Errorf("external: want a mapping, got %s", oh.External)
		}
		if _, err := extconfig.Decode(oh.External); err != nil {
			return fmt.Errorf("external: %w", err)
		}
		fc.External = oh.External
	}
	return nil
}
