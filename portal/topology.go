package portal

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// topologyMode is how topology hints narrow a Service port's Cluster-policy
// endpoints on this node.
type topologyMode uint8

// The modes, as kube-proxy v1.37 (pkg/proxy/topology.go) chooses them.
const (
	// topologyNone: every ready endpoint.
	topologyNone topologyMode = iota
	// topologySameNode: the ready endpoints whose hints.forNodes name
	// this node (trafficDistribution: PreferSameNode).
	topologySameNode
	// topologySameZone: the ready endpoints whose hints.forZones name
	// this node's zone (PreferSameZone, its alias PreferClose, and the
	// topology-mode annotation).
	topologySameZone
)

// topology is what the hints decided for one Service port: the mode, and
// in words, for Portal.Topology.
type topology struct {
	mode topologyMode
	why  string
}

// chooseTopology picks the mode from the hints of the ready candidates,
// as kube-proxy does, reading no field of the Service: the EndpointSlice
// controller writes hints only for the Services that ask (and removes
// them from the others), so the hints alone decide.
//   - Node hints when every ready endpoint has one and one of them names
//     this node.
//   - Otherwise zone hints when every ready endpoint has one and one of
//     them names this node's zone.
//   - Otherwise none: all ready endpoints, wherever they are.
//
// When no ready endpoint has hints and the Service asks for none, why is
// "": the common case says nothing.
func chooseTopology(cands []candidate, node, zone string, asked bool) topology {
	ready, nodeHinted, zoneHinted := 0, 0, 0
	forNode, forZone := false, false
	for _, c := range cands {
		if !c.ready {
			continue
		}
		ready++
		if len(c.nodeHints) > 0 {
			nodeHinted++
			forNode = forNode || slices.Contains(c.nodeHints, node)
		}
		if len(c.zoneHints) > 0 {
			zoneHinted++
			forZone = forZone || slices.Contains(c.zoneHints, zone)
		}
	}
	if !asked && nodeHinted == 0 && zoneHinted == 0 {
		return topology{}
	}
	switch {
	case ready == 0:
		return topology{why: "none: no ready endpoint"}
	case nodeHinted == ready && forNode:
		return topology{mode: topologySameNode, why: "node hints for " + node}
	case zoneHinted == ready && forZone:
		return topology{mode: topologySameZone, why: "zone hints for " + zone}
	case nodeHinted == 0 && zoneHinted == 0:
		return topology{why: "none: no endpoint has hints"}
	}
	// Why each kind of hint was passed over; a kind no endpoint carries
	// (node hints of a PreferSameZone Service) goes unmentioned.
	var why []string
	switch {
	case nodeHinted == 0:
	case nodeHinted < ready:
		why = append(why, "not every ready endpoint has a node hint")
	default:
		why = append(why, "no endpoint hinted for node "+node)
	}
	switch {
	case zoneHinted == 0:
	case zoneHinted < ready:
		why = append(why, "not every ready endpoint has a zone hint")
	case zone == "":
		why = append(why, "this node has no "+v1.LabelTopologyZone+" label")
	default:
		why = append(why, "no endpoint hinted for zone "+zone)
	}
	return topology{why: "none: " + strings.Join(why, "; ")}
}

// allows reports whether c may serve under the mode. There is no fallback
// here: that happened when the mode was chosen.
func (t topology) allows(c candidate, node, zone string) bool {
	switch t.mode {
	case topologyNone:
		return true
	case topologySameNode:
		return slices.Contains(c.nodeHints, node)
	case topologySameZone:
		return slices.Contains(c.zoneHints, zone)
	}
	return true
}

// asksForTopology reports whether svc asks the EndpointSlice controller
// for hints: a trafficDistribution, or the topology-mode annotation (or
// its older name) with a value other than Disabled. It only decides
// whether Portal.Topology explains itself when there are no hints.
func asksForTopology(svc *v1.Service) bool {
	if svc.Spec.TrafficDistribution != nil && *svc.Spec.TrafficDistribution != "" {
		return true
	}
	for _, a := range []string{v1.AnnotationTopologyMode, v1.DeprecatedAnnotationTopologyAwareHints} {
		if v := svc.Annotations[a]; v != "" && v != "Disabled" && v != "disabled" {
			return true
		}
	}
	return false
}
