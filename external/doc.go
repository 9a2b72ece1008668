// Package external gets external IPs to the nodes that can serve them: it
// hands out LoadBalancer IPs from address pools (one leader-elected allocator
// per cluster, package ipam holds the pure logic), decides for every external
// IP which nodes should receive its traffic, and tells the cloud hook's
// providers (BGP, L2 ARP/NDP, webhook; see Provider) so. It also models pod
// external IPs (PodExternalIPs).
//
// A node announces an IP only after its own dataplane has programmed it: the
// agent calls Hook.Programmed after each successful sync.
package external
