// Package conntrack holds the real-kernel tests of dataplane.ConntrackCleaner
// driven by the nftables backend: UDP flows that keep sending across
// endpoint changes, Service creation, scale 1 -> 0 -> 1, and changes that
// reach the cleaner as the agent hands them over (OnApplied, batched into
// one walk), in throwaway network namespaces. It lives apart from package
// dataplane because nft imports dataplane.
package conntrack
