// Package claims decides who holds each external address, and why a claim
// on it is refused: node addresses, cluster IPs, load-balancer
// allocations, spec.externalIPs and pod external IPs (the annotation
// onehop.io/external-ip; PodExternalIP) all compete for addresses, and the
// Registry gives each to one holder, from API state alone, so that every
// agent gives an address to the same holder. A refused claimant gets an
// event (Refusal), and a Service's refused spec.externalIPs are not served
// (Ownership.RefusedExternal).
//
// In a split install the controller settles the contested claims and
// records them in the grants ConfigMap (Publish), which node agents follow
// (SettledPods, DecodeExternalGrants).
//
// It reads objects it is given and writes only the grants ConfigMap: it
// runs no informer and sends no event. It must not import package
// external, nor external/leases or external/providers.
package claims
