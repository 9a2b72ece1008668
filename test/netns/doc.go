// Package netns stands up a small Kubernetes cluster out of network
// namespaces, for end-to-end tests and the demo, with real parts only:
//
//   - a control-plane namespace running etcd + kube-apiserver (package
//     test/cluster), reachable on the node segment;
//   - N node namespaces, each running a real `agent` process, each with a
//     bridge (cbr0) and pod namespaces veth'ed into it; every pod runs an
//     echo server (test/nsutil's ServeEcho) on TCP and UDP;
//   - a router namespace joining the node segment (192.0.2.0/24) with the
//     external client's segment (198.51.100.0/24) and routing the external
//     service range (203.0.113.0/24) to a node;
//   - a client namespace standing for a host outside the cluster.
//
// Nodes reach each other's pod CIDRs (10.244.N.0/24) by direct routes on the
// node segment. Node objects are registered through the API with their
// InternalIP; Services and EndpointSlices are written the way the
// EndpointSlice controller writes them (see Services.go).
//
// Every namespace is named with a per-run prefix (nsutil.RunID) and is deleted,
// with every process in it, by Close: on success, on failure, and on SIGINT
// or SIGTERM. Namespaces of a run that was SIGKILLed are swept by the next.
// No packet leaves the namespaces this package created.
package netns
