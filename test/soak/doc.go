// Package soak runs the real agent for a long time under a steady stream
// of changes and fails on what only time shows: memory, goroutines or file
// descriptors that keep growing, and kernel state (nftables elements,
// conntrack entries) that drifts from what the Services need.
//
// TestSoak stands up the namespace cluster of package test/netns (two
// nodes of four pods, real agents, a real kube-apiserver) and, for
// ONEHOP_SOAK_DURATION (default 5m, `make soak` 1h):
//
//   - churns: a seeded random stream of changes written through the API
//     server at ONEHOP_SOAK_RATE changes per second (default 100), by 8
//     writers over 200 Service slots kept about half full (model.go):
//     Services created and deleted, endpoints scaled up and down, pods
//     replaced, port numbers changed, externalTrafficPolicy flipped,
//     ClientIP affinity added and removed. Services are ClusterIP or
//     NodePort, single- or dual-stack, with TCP and UDP ports. A pod
//     sends UDP requests to the churned Services meanwhile (answers not
//     checked), so that changes leave flows behind. ONEHOP_SOAK_SEED
//     replays a stream; the run prints its seed.
//   - asks, from a pod on node 1, three stable Services the churn never
//     touches (a TCP and a UDP cluster IP, a TCP node port), one request
//     after the other on a new connection each. Any request that fails
//     fails the test: no answer within nsutil.EchoTimeout (refused, reset,
//     timed out) or an answer from a pod that is not an endpoint.
//   - samples node 1's agent every ONEHOP_SOAK_INTERVAL (default a
//     twentieth of the run, between 15 s and 1 min): VmRSS, Go heap in
//     use (go_memstats_heap_inuse_bytes) and goroutines (go_goroutines)
//     from its /metrics, open descriptors (/proc/<pid>/fd), the elements
//     of table inet onehop and the conntrack entries in the node's
//     namespace (both over netlink).
//
// It fails when RSS, heap, goroutines or descriptors grow over the second
// half of the run beyond the leak rule's bound (trend.go: a least-squares
// line's growth against 3 times the noise, 5% of the mean and a floor).
// Elements and conntrack entries rise and fall with the Services, so they
// are compared with the desired state instead, once the churn has stopped
// and the agents have taken in the last change: no DNATed UDP entry on
// node 1 may still point where a change undid (to an address no Service
// has, or to a pod no longer its endpoint), and each node's table must be
// the one a fresh agent builds from an empty table for the same Services
// (chains and rule counts, sets, elements; endpoint maps by count per
// family, as their keys hold ids the agents assign; affinity sets by name,
// as traffic fills them).
//
// The samples table is printed at the end; ONEHOP_SOAK_REPORT=path appends
// it, with the machine's load, to path (`make soak`: docs/bench/soak.md).
// The achieved rate of changes is reported, not judged: no wall-clock
// figure decides but the leak rule's relative bound. In `make test` it
// runs the 5-minute version when run as root, as the other namespace
// end-to-end packages do; without root it skips.
//
// Every namespace and process is test/netns's, and is removed at the end,
// on failure too; no packet leaves them.
package soak
