// Package ipam hands out LoadBalancer IPs from address pools. It is pure
// logic: no Kubernetes client, no kernel. The allocator controller in package
// external feeds it Services and writes its answers to Service status.
//
// The allocator never gives one IP to two Services unless both asked to share
// it (same sharing key) and their ports do not collide.
package ipam
