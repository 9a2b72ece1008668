// Package external gets external IPs to the nodes that can serve them. It
// is the cloud hook that joins the rooms below it: it watches the cluster,
// asks the registry who holds each address (package external/claims),
// runs the cluster-wide LoadBalancer IP allocator while it holds the
// allocator Lease (external/alloc, external/leases), computes for every
// external IP which nodes should receive its traffic and tells the
// providers (BGP, L2 ARP/NDP, webhook, the caller's own: package
// external/providers) so. It also models pod external IPs
// (claims.PodExternalIP).
//
// A node announces an IP only after its own dataplane has programmed it
// for every one of its rightful holders: the agent calls Hook.Programmed
// after each successful sync.
//
// The hook has a cluster-wide part (allocator, Service status, webhook,
// refusal events; one leader at a time: lead.go) and a per-node part
// (providers, the node's liveness Lease, and with a key its heartbeats to
// the other L2 nodes: node.go). Every agent may run both (New), or they
// run apart (Config.SeparateController and NewController, for `agent
// controller`), so that node agents need no right to write Service status
// or any Lease but their own (role).
//
// With Config.CRDs the configuration comes from the onehop.io custom
// resources as well (package external/config), followed without a
// restart: reload puts a new configuration in force, restarting only the
// providers whose configuration changed, and the holder of the allocator
// Lease writes each object's status.
//
// Its subpackages must not import it; README.md says which imports which.
package external
