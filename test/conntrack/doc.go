// Package conntrack holds the real-kernel tests of dataplane.ConntrackCleaner
// driven by the nftables backend: UDP flows that keep sending across
// endpoint changes, Service creation and scale 1 -> 0 -> 1, in throwaway
// network namespaces. It lives apart from package dataplane because nft
// imports dataplane.
package conntrack
