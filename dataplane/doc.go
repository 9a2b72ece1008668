// Package dataplane owns what every onehop backend shares: the Dataplane
// interface that nftables and IPVS implement, the node-level Config they are
// built with, the Dump model that `agent dump-rules` prints, and the sync
// Runner that batches changes, paces syncs between the minimum and maximum
// sync period, retries failures with back-off and forces a full resync when
// the kernel state was changed behind the agent's back. It also holds the
// node-local helpers the agent needs around a backend: writing sysctls
// (conntrack.*) and following the node's interface addresses
// (nodePortAddresses CIDRs).
package dataplane
