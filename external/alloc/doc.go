// Package alloc is the cluster-wide LoadBalancer IP allocator: while its
// process holds the allocator Lease, Allocator hands out addresses from
// the pools in force (package external/ipam holds the pure logic) and
// writes them to Service status, one new Allocator each leadership term,
// its state rebuilt from that status. It also reads what a Service asks
// for: onehop's annotations and load-balancer class, and MetalLB's
// spellings of the annotations (RequestFor, Managed).
//
// It does not elect itself, and does not know who else holds an address:
// the hook gives it that (Allocator.SetReserved). It must not import
// package external, nor external/claims, external/leases or
// external/providers, which build on it.
package alloc
