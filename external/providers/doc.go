// Package providers is what the cloud hook tells its providers and the
// providers it comes with. Targets computes, for every external IP's
// rightful holders (package external/claims), the nodes that should
// receive its traffic; a State is that, with what this node's dataplane
// serves, the nodes' liveness and the advertisements (package
// external/config), told to every Provider. The built-in ones drive the
// BGP speaker (BGP), the L2 responder (L2: which node answers for each
// address, kept as the cluster changes, and how two nodes answering one
// settle it) and the webhook sender (Webhook); Health follows their
// failures and back-off, BGPPeers their BGP sessions' metrics.
//
// It starts no provider and watches nothing: the hook does. It must not
// import package external.
package providers
