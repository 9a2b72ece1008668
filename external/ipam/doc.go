// Package ipam hands out LoadBalancer IPs from address pools. It is pure
// logic: no Kubernetes client, no kernel. The allocator controller in package
// external/alloc feeds it Services and writes its answers to Service status.
//
// The allocator never gives one IP to two Services unless both asked to share
// it (same sharing key, same namespace unless the pool shares across
// namespaces, same traffic policy and, for Local, the same pods) and their
// ports do not collide. A pool serves only the namespaces and Service labels
// it admits; pools meant for Pods are never auto-assigned; addresses someone
// else holds (Allocator.Reserved) are neither handed out nor kept.
//
// Of onehop it imports package portal alone: it must not import package
// external or any of its other subpackages.
package ipam
