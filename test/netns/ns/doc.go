// Package ns holds the network-namespace primitives the end-to-end harness is
// built from: creating and deleting named namespaces (the `ip netns` kind,
// bind-mounted under /run/netns), running a function or a socket call inside
// one on a locked OS thread, starting long-lived processes inside one, and
// sweeping namespaces left behind by a test binary that was killed.
//
// Nothing here touches the root network namespace's links, routes or
// nftables: every change is made inside a namespace this package created.
package ns
