// Package heartbeat is the L2 provider's liveness between the agents on
// the node network: every agent sends a small UDP datagram to every other
// L2 node every interval (100 ms), and a peer none of whose datagrams came
// for missed intervals (3: 300 ms) is dead. It works with the apiserver up
// or down; which nodes are peers (the membership) is the caller's, from
// the nodes' liveness Leases.
//
// A datagram carries the sender's node name, its incarnation (a number
// that grows with each start of its agent: the start time in nanoseconds)
// and a sequence number, and is authenticated with HMAC-SHA256 over a key
// every node shares (Encode, Decode). A receiver takes a datagram only
// when its sequence number is above the last one taken from that
// incarnation, or its incarnation is higher (Peers.Accept): a captured
// datagram sent again is refused.
//
// A stopping agent's last datagram says whether it leaves (dead at once)
// or restarts: then its peers hold it alive for their restart hold while
// its node answers ICMP echo requests (echo.go), since its kernel still
// forwards; its new incarnation's first datagram ends the hold.
//
// Peers is the pure part (no clock, no socket); Heartbeat sends, receives
// and tells the caller when a peer becomes alive or dead. It never reads
// Kubernetes objects, and must not import package external or any of its
// other subpackages.
package heartbeat
