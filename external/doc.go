// Package external gets external IPs to the nodes that can serve them: it
// hands out LoadBalancer IPs from address pools (one leader-elected allocator
// per cluster, package ipam holds the pure logic), decides for every external
// IP which nodes should receive its traffic, and tells the cloud hook's
// providers (BGP, L2 ARP/NDP, webhook; see Provider) so. It also models pod
// external IPs (PodExternalIP).
//
// One registry (registry.go) decides who holds each address: node addresses,
// cluster IPs, load-balancer allocations, spec.externalIPs and pod external
// IPs; a claim on a held address is refused with an event on the claimant.
// Only rightful holders are announced, and a node announces an IP only after
// its own dataplane has programmed it for every one of them: the agent calls
// Hook.Programmed after each successful sync.
//
// The hook has a cluster-wide part (allocator, Service status, webhook,
// refusal events; one leader at a time) and a per-node part (providers, the
// node's liveness Lease, and with a key its heartbeats to the other L2
// nodes, package external/heartbeat). Every agent may run both (New), or they run apart
// (Config.SeparateController and NewController, for `agent controller`), so
// that node agents need no right to write Service status or any Lease but
// their own (role.go).
//
// With Config.CRDs the configuration comes from the onehop.io custom
// resources as well (package external/api/v1alpha1), followed without a
// restart: convertCRDs turns them, object by object, into a Config that
// the controller and every agent compute alike, forNode picks one node's
// part, reload puts it in force (restarting only the providers whose
// configuration changed) and the holder of the allocator Lease writes each
// object's status (crdstatus.go).
package external
