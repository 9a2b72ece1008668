// Package fakecluster is a small cluster for the cloud hook's tests: World
// holds nodes, Services, Pods and EndpointSlices with the registry of
// package external/claims over them, and Clocked is the liveness tracker
// of package external/leases on a hand-driven clock.
//
// Only tests import it: those of external/claims and external/leases from
// outside them (package claims_test, leases_test), and the internal tests
// of the packages above them. It must not import package external,
// external/alloc or external/providers.
package fakecluster
