// Package semantics holds the end-to-end tests of the Service
// semantics on the namespace cluster (package test/netns): session
// affinity, externalTrafficPolicy Local with the client's address seen by
// the pod, health-check node ports, terminating-endpoint fallback,
// loadBalancerSourceRanges and UDP flows across endpoint changes, each
// proven with real traffic through real agents and a real kube-apiserver.
package semantics
