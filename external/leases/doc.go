// Package leases holds what the cloud hook builds on coordination.k8s.io
// Leases:
//
//   - the allocator Lease (AllocatorLeaseName), which elects the one
//     process that runs the hook's cluster-wide part: a leadership term
//     ends at the Lease's renew deadline (Fence, FencedLock), the leader's
//     events are written within its terms only (EventSink), and each
//     term of the webhook sender is recorded on the Lease
//     (ClaimWebhookTerm);
//   - one liveness Lease per L2 node, renewed by its agent, which tells
//     which agents are alive (Liveness), with the nodes heard answering on
//     the segment and, with a key, the L2 heartbeats deciding over it
//     (ReadHeartbeatKeys, RegisterHeartbeatMetrics).
//
// It campaigns for nothing itself: client-go's leader election runs in
// the hook. It must not import package external, nor external/config,
// external/claims, external/alloc or external/providers.
package leases
