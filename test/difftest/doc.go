// Package difftest gives kube-proxy (v1.37, nftables mode) and onehop's
// agent the same random Services and compares the packets: what each
// vantage point reaches through each way into a Service.
//
// It owns:
//   - the twins (twin.go, topology.go, proxies.go): two dual-stack clusters
//     built the same way out of network namespaces, each with its own etcd
//     and kube-apiserver (package test/cluster) allocating from an IPv4 and
//     an IPv6 service CIDR, the same node names, node IPs, pod IPs, router
//     and outside client, each with an address of both families (plan.go).
//     Twin "kube-proxy" runs kube-proxy on every node, twin "onehop" the
//     agent with the flags test/netns gives it, under deploy/base's RBAC. No kubelets and no
//     controllers run: the test writes Nodes, Services and EndpointSlices
//     to both API servers alike (objects.go);
//   - the cases (case.go, generate.go): Services (single-stack IPv4 or
//     IPv6, or dual-stack either family first) and their endpoints drawn
//     from a seed, with EndpointSlices per family, printable as the YAML of
//     their objects;
//   - the probes (probe.go, targets.go): from the outside client, a pod on
//     each node and each node itself, to every way in of both families,
//     each recording the set of (pod, source IP it saw) pairs or refused,
//     unreachable, timed out;
//   - the comparison (compare.go, allowed.go): every difference fails the
//     test unless it is on the deliberate list (with its reason, also in
//     docs/difftest.md) or on the list of known differences still under
//     investigation;
//   - shrinking (shrink.go): a failing case loses Services, ports,
//     endpoints and a dual-stack Service's families one at a time while a
//     difference remains, from every state of its change sequence alike,
//     and the changes before the one that differs.
//
// See docs/difftest.md for how to run it and what it has found.
//
// A barrier (barrier.go) makes every comparison fair: after a case is
// written, each twin gets a fresh dual-stack Service, and probing starts
// once every node answers on both its cluster IPs, so each proxy (and each
// family's, kube-proxy running one per family) has seen everything written
// before.
//
// It never touches the root namespace: every namespace is named with the
// run's prefix (nsutil.RunID) and deleted, with its processes, when the
// test ends. Probes stay inside the twins' namespaces.
//
// A case then changes (changes.go): scale up, down or to zero, delete and
// recreate, flip a traffic policy, terminate a pod, change affinity. Each
// state is written over the last, and flows opened before a change
// (flows.go) say after it whether they kept their pod.
package difftest
