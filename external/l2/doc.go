// Package l2 is the cloud hook's layer-2 provider: the node that owns an
// external IP answers ARP (IPv4) and NDP neighbour solicitations (IPv6) for
// it on its uplinks, without configuring the address on any interface, and
// announces itself gratuitously, in a burst, when it takes an IP over. Which
// node owns an IP is decided by Owner, the same pure function on every node.
// Probe asks whether another host still answers for an IP before a
// takeover, and a responder reports another host announcing an IP it
// answers for (OnConflict), so that of two nodes answering one yields.
//
// It answers on the interfaces it is given: by default the one holding the
// node's address (InterfaceOf), and those an interface pattern matches
// (WithPatterns).
//
// Answering needs CAP_NET_RAW. The IP must not also be on lo of several
// nodes: with arp_ignore=0 every one of them would answer.
//
// It must not import package external or any of its other subpackages.
package l2
