package nft

import (
	"fmt"
	"strings"

	"github.com/onehop/onehop/portal"
)

// TableName is the only table onehop owns (family inet).
const TableName = "onehop"

// Base chains and fixed objects of the table.
const (
	chainNatPrerouting  = "nat-prerouting"
	chainNatOutput      = "nat-output"
	chainNatPostrouting = "nat-postrouting"
	chainFilterInput    = "filter-input"
	chainFilterForward  = "filter-forward"
	chainFilterOutput   = "filter-output"
	chainServices       = "services"
	chainNoEndpoints    = "noep-check"
	chainNoEndpointsNP  = "noep-nodeport-check" // jumped to from filter-input only
	chainReject         = "reject"
	chainDrop           = "drop"
)

// fam returns the "4" or "6" suffix of family-specific objects.
func fam(f portal.Family) string {
	if f == portal.IPv6 {
		return "6"
	}
	return "4"
}

func setVIPs(f portal.Family) string          { return "vips" + fam(f) }
func setNodePorts(f portal.Family) string     { return "nodeports" + fam(f) }
func setNodePortIPs(f portal.Family) string   { return "nodeport-ips" + fam(f) }
func setNoEndpoints(f portal.Family) string   { return "noep" + fam(f) }
func setNoEndpointsNP(f portal.Family) string { return "noep-nodeports" + fam(f) }
func setHairpin(f portal.Family) string       { return "hairpin" + fam(f) }
func setClusterIPs(f portal.Family) string    { return "cluster-ips" + fam(f) }
func setPodDNAT(f portal.Family) string       { return "pod-dnat" + fam(f) }
func setPodSNAT(f portal.Family) string       { return "pod-snat" + fam(f) }
func setExtMarks(f portal.Family) string      { return "ext-marks" + fam(f) }
func setNodePortMarks(f portal.Family) string { return "np-marks" + fam(f) }

// The ways in behind loadBalancerSourceRanges: each maps a way in to a
// jump to its Service's firewall chain (see firewallChain).
func setFirewall(f portal.Family) string   { return "fw" + fam(f) }
func setFirewallNP(f portal.Family) string { return "fw-nodeports" + fam(f) }

// firewallGuard returns the ids of the elements whose way in a firewall
// element guards (the @vips or @nodeports element of the same key, or the
// no-endpoints one when the Service has none: a client outside the ranges
// is dropped, as by kube-proxy, before it could be told the port is
// closed), and false for an element of another set.
func firewallGuard(e elem) ([2]string, bool) {
	for _, f := range families {
		switch e.set {
		case setFirewall(f):
			return [2]string{setVIPs(f) + "\x00" + e.key, setNoEndpoints(f) + "\x00" + e.key}, true
		case setFirewallNP(f):
			return [2]string{setNodePorts(f) + "\x00" + e.key, setNoEndpointsNP(f) + "\x00" + e.key}, true
		}
	}
	return [2]string{}, false
}

// endpointShards spreads the endpoint maps: binding a rule to a data map
// makes the kernel walk all of the map's elements, and adding an element
// checks it against every rule bound to its map, so a map's cost grows
// with the product of its elements and its rules. At 64 maps per family
// that product was half of a full sync's time at 50k Services x 10
// endpoints (14.4 s); at 256, 6.7 s, and the same at 10k.
const endpointShards = 256

func setEndpoints(f portal.Family, id uint32) string {
	return fmt.Sprintf("endpoints%s-%02d", fam(f), id%endpointShards)
}

// rangeSetPrefix starts the names of the Services' sets of source ranges
// (loadBalancerSourceRanges): sr<family>/<namespace>/<name>, one interval
// set per Service and family that every fw chain of the Service looks the
// client up in, so that a Service's rules do not grow with its number of
// ranges. Namespaces and names are DNS labels of at most 63 bytes: the
// name stays far below the kernel's 255.
const rangeSetPrefix = "sr"

func rangeSet(f portal.Family, k portal.ServiceKey) string {
	return rangeSetPrefix + fam(f) + "/" + k.Namespace + "/" + k.Name
}

// firewallChain is the chain that checks a client against the set of
// source ranges named rangeSet: fw<f>/<namespace>/<name>, one per Service
// and family, whatever its number of ports.
func firewallChain(rangeSet string) string {
	return kindFirewall + strings.TrimPrefix(rangeSet, rangeSetPrefix)
}

// isRangeSet reports whether a set of the table is a Service's set of
// source ranges.
func isRangeSet(name string) bool {
	return strings.HasPrefix(name, rangeSetPrefix) && strings.Count(name, "/") == 2
}

// Per-portal chains are named kind<family>/<namespace>/<name>/<proto>/<port>,
// readable in `nft list` and parsed back by dump-rules. Port names are DNS
// labels, so "_" (an unnamed port) cannot clash with a real name.
const (
	kindService  = "svc"
	kindExternal = "ext"
	kindAll      = "all" // all endpoints, when the svc chain only has local ones
	kindFirewall = "fw"  // loadBalancerSourceRanges: fw<f>/<namespace>/<name>, one per Service
	// kindAffinityEndpoint chains remember a client and DNAT to one
	// endpoint; named kind<f>/.../<port>@<endpoint>.
	kindAffinityEndpoint = "aep"
)

func portalChain(kind string, k portal.PortKey) string {
	port := k.Port
	if port == "" {
		port = "_"
	}
	return fmt.Sprintf("%s%s/%s/%s/%s/%s", kind, fam(k.Family), k.Service.Namespace, k.Service.Name, k.Protocol, port)
}

// parsePortalChain is the inverse of portalChain.
func parsePortalChain(name string) (kind string, k portal.PortKey, ok bool) {
	parts := strings.Split(name, "/")
	if len(parts) != 5 || len(parts[0]) < 2 {
		return "", k, false
	}
	kind, f := parts[0][:len(parts[0])-1], parts[0][len(parts[0])-1]
	switch f {
	case '4':
		k.Family = portal.IPv4
	case '6':
		k.Family = portal.IPv6
	default:
		return "", k, false
	}
	proto, ok := portal.ParseProtocol(parts[3])
	if !ok {
		return "", k, false
	}
	k.Service = portal.ServiceKey{Namespace: parts[1], Name: parts[2]}
	k.Protocol = proto
	if parts[4] != "_" {
		k.Port = parts[4]
	}
	return kind, k, true
}
