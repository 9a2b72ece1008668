// Package nsutil is the one set of network-namespace helpers onehop's tests
// use: creating uniquely named namespaces (the `ip netns` kind, bind-mounted
// under /run/netns) that are deleted when the test ends, pass or fail;
// joining them with veth pairs; setting sysctls; running functions, short
// commands and long-lived processes inside them; dialing and listening from
// inside them; echo servers and the clients that ask them; sweeping what a
// killed test binary left behind; and the nft tests' node topology (see
// NodeTopology), shared by every test that programs a node's dataplane.
//
// Two layers share one implementation. Functions taking a namespace name and
// a context (Create, Delete, IP, Exec, Do, Dialer, Start, ...) serve
// harnesses that outlive one test, such as test/netns's cluster and its demo
// command. New returns an *NS bound to a testing.TB, whose methods fail the
// test on error and whose namespace, processes and sockets are removed by
// t.Cleanup.
//
// Nothing here touches the root network namespace's links, routes or
// nftables: every change is made inside a namespace this package created.
// Sockets a function opens inside a namespace stay there for their whole
// life, so only their creation needs to run in it.
package nsutil
