// Package nft is onehop's nftables backend. It owns one table, `inet onehop`,
// and programs it over netlink (github.com/google/nftables) in one atomic
// transaction per sync, keeping what it applied in memory so that a change
// to one Service sends only that Service's map elements and chains. It never
// touches another table, and reads no Kubernetes object: it renders the
// portals it is given.
//
// The ruleset below is written in nft syntax. `agent dump-rules -o nft`
// prints the live one as `nft list table inet onehop` does;
// testdata/ruleset.golden and testdata/ruleset-policies.golden are rendered
// examples. Only the IPv4 half is shown: the IPv6 half is the same with ip6
// and the sets ending in 6. <f> is the family (4 or 6), "..." stands for
// <namespace>/<name>/<protocol>/<port> of a Service port, <masq> for the
// masquerade bit of the packet mark.
// TestDocNamesTheRuleset fails when a chain, set or map named here is not in
// the table, or the table has one not named here.
//
// Dispatch: the nat chains send a new connection through one hash lookup,
// whatever the number of Services.
//
//	chain nat-prerouting (priority dstnat), chain nat-output (-100): jump services
//	chain services
//	    ip daddr @cluster-ips4 ip saddr != <cluster CIDR> meta mark set meta mark | <masq>
//	    ip daddr . meta l4proto . th dport @ext-marks4 meta mark set meta mark | <masq>
//	    ip daddr . meta l4proto . th dport vmap @fw4
//	    ip daddr . meta l4proto . th dport vmap @vips4
//	    ip daddr . meta l4proto . th dport @flat-vips4 goto flat4
//	    ip daddr @nodeport-ips4 meta l4proto . th dport @np-marks4 meta mark set meta mark | <masq>
//	    ip daddr @nodeport-ips4 meta l4proto . th dport vmap @fw-nodeports4
//	    ip daddr @nodeport-ips4 meta l4proto . th dport vmap @nodeports4
//	    ip daddr @nodeport-ips4 meta l4proto . th dport @flat-nodeports4 goto flat-nodeports4
//	    dnat ip to ip daddr map @pod-dnat4
//
// The first rule marks cluster-IP traffic from outside the cluster CIDRs for
// masquerade (all of it with --masquerade-all); @ext-marks4 and @np-marks4
// hold the external, load-balancer and node ports of Services whose external
// traffic policy is Cluster. @vips4 maps each cluster, external and
// load-balancer IP . protocol . port to the Service port's chain, @nodeports4
// each protocol . node port, on the addresses in @nodeport-ips4 (@fw4 and
// @fw-nodeports4 check source ranges first, below):
//
//	10.96.0.20 . tcp . 443 comment "cluster-ip svc4/demo/sticky/tcp/_" : goto svc4/demo/sticky/tcp/_
//
// @pod-dnat4 sends a pod's own external IP to the pod, every protocol and port.
//
// Flat ways in (flat.go): a way into a Service port that picks at random
// among 1 to 16 endpoints, with no ClientIP affinity, Maglev, source
// ranges, topology hints or internalTrafficPolicy: Local, and the cluster
// IP of a Service whose external ways in are Local, is no chain of its
// own: an element of @flat-vips4 (@flat-nodeports4 for a node port), and
// one element per endpoint in the map of its endpoint count. A Service, an
// endpoint or an address change is then element updates only, which the
// kernel applies without validating the whole table, so its cost does not
// grow with the number of Services:
//
//	chain flat<f>
//	    dnat ip to ip daddr . meta l4proto . th dport . numgen random mod <count> map @flat<f>-<count>   (a rule per count, 01 to 16)
//	chain flat-nodeports<f>
//	    dnat ip to meta l4proto . th dport . numgen random mod <count> map @flat-nodeports<f>-<count>
//
//	@flat4-02: 10.96.0.10 . tcp . 80 . 1 comment "cluster-ip svc4/demo/web/tcp/http" : 10.244.3.2 . 8080
//
// dump-rules lists such a Service port with the note "flat": its ways in
// have no packet counter.
//
// Every other Service port has one chain per family that picks an endpoint:
//
//	chain svc<f>/...
//	    counter dnat ip to numgen random mod 1 offset <id> . numgen random mod 2 map @endpoints<f>-<shard>
//
// The endpoints of all Service ports are spread over 256 maps per family,
// keyed by the chain's id . the index numgen picks, so that a pod replaced is
// an element update that touches no rule. Each element names its chain:
//
//	2 . 0 comment "svc4/demo/web/tcp/http" : 10.244.2.2 . 8080
//
// The rule loads the id with a numgen of one value, offset by the id: nft
// prints a constant loaded into a map's key as `0x2 [invalid type]`, which
// names nothing. The maps are declared as nft would declare them for such
// keys, typeof numgen random mod 1 . numgen random mod 1 : ip daddr . th
// dport, so that nft prints both halves of a key as numbers (typeof.go).
// One endpoint is picked the same way (mod 1): a new rule makes the kernel
// validate the whole table, which at 10k Services costs more than the rest
// of the sync, and a one-replica Service whose pod is replaced is the most
// common change there is.
//
// A Service port that balances by Maglev (the onehop.io/balancing: maglev
// annotation, or --balancing maglev for all) picks by a hash of the
// connection instead, with a seed that is the same on every node, in a
// Maglev lookup table (dataplane.MaglevTable) that the endpoint maps hold,
// one element per slot (<id> . <slot> : 10.244.2.2 . 8080):
//
//	chain svc<f>/...
//	    meta nfproto ipv4 counter dnat ip to numgen random mod 1 offset <id> . jhash ip saddr . th sport . ip daddr . th dport . meta l4proto mod 1021 seed 0x6f6e6568 map @endpoints<f>-<shard>
//
// The table is made from the endpoints alone, so every node that has them
// sends a flow to the same one: a flow that a router moves to another node
// reaches the same pod. It has a prime number of slots, at least 100 per
// endpoint: 1021 for up to 10 endpoints, 4093 up to 40, 16381 up to 163,
// 65521 beyond. An endpoint that comes or goes rewrites the slots whose
// endpoint changed, about 1/N of them plus Maglev's own extra (12 to 13%
// of the slots when one of 10 goes, under 5% for one of 40, 2.4% for one
// of 100), as element updates; only a new table size (the endpoint count
// crossing 10, 40 or 163) rewrites the rule and every slot, and remaps
// nearly every flow. Each endpoint holds the table's size over N slots,
// give or take one. testdata/ruleset-maglev.golden shows such a chain.
// `agent trace` computes the hash as the kernel does, for the source port
// given (40000 when none is), and says that another source port may go
// elsewhere. ClientIP affinity takes precedence: a Service port with both
// has the affinity chains below, whose memory is per node, and its new
// clients are picked at random.
//
// With ClientIP affinity the chain sends a client it remembers back to its
// endpoint, and a new client to a random one, whose chain remembers it:
//
//	chain svc<f>/...
//	    ip saddr @aff<f>/...@<endpoint> goto aep<f>/...@<endpoint>   (per endpoint)
//	    numgen random mod 2 vmap { 0 : goto aep<f>/...@<endpoint>, 1 : goto aep<f>/...@<endpoint> }
//	chain aep<f>/...@<endpoint>
//	    update @aff<f>/...@<endpoint> { ip saddr timeout <timeout> } counter dnat ip to <endpoint>
//
// The sets and aep chains are the portal's, one per endpoint, shared by
// every chain of the portal that picks endpoints (svc, and ext and all
// below), as kube-proxy shares them: a client that reached an endpoint by
// one way in is sent back to it by the others that have it (a client of
// an externalTrafficPolicy: Local Service sticks to one pod through its
// cluster IP and its node port). A chain with one endpoint goes through
// its aep chain too (goto aep<f>/...@<endpoint>): the client is remembered
// for the other chains, and stays on the pod when more endpoints come. A
// new timeout rewrites the aep chain's rule and keeps the remembered
// clients.
//
// Policies add chains in front (a way in is a @vips4 or @nodeports4 element
// whose goto names the first chain it takes):
//
//	chain all<f>/...   all endpoints, when internalTrafficPolicy: Local leaves svc<f>/... only local ones
//	chain ext<f>/...   externalTrafficPolicy: Local
//	    ip saddr <cluster CIDR> goto svc<f>/...                (pods reach all endpoints)
//	    fib saddr type local meta mark set meta mark | <masq> goto svc<f>/...   (the node too; all<f>/... when there is one)
//	    counter dnat ...                                       (this node's endpoints, source kept; drop when none)
//
// loadBalancerSourceRanges: @fw4 maps each load-balancer IP . protocol .
// port of a Service with source ranges (@fw-nodeports4 its node ports, when
// the configuration applies the ranges to node ports too) to a jump to the Service's one chain per
// family, which drops a client outside them; one within them comes back
// and is dispatched by @vips4 or @nodeports4 as without ranges:
//
//	203.0.113.11 . tcp . 80 : jump fw<f>/<namespace>/<name>
//	chain fw<f>/<namespace>/<name>
//	    ip saddr != @sr<f>/<namespace>/<name> counter drop
//
// A Service's source ranges are one interval set per family, which its fw
// chain looks the client up in: its rules grow neither with the number of
// ranges nor with the number of ports, new ranges refill the set without
// touching a rule, and a sync that makes the kernel validate the table (one
// that writes a rule or a jump) walks one chain for the ranges of a
// Service, not one per port.
//
// Refusals: the filter chains reject new connections to a Service port
// without endpoints before they reach a socket of the node. Node ports are
// checked on the way in only, as kube-proxy checks them: the node's own
// datagram to its node port is refused when it comes back in through
// loopback (a reject on output would fail the send with EPERM instead).
//
//	chain filter-input (priority filter - 10): ct state new jump noep-check; ct state new jump noep-nodeport-check
//	chain filter-forward, chain filter-output (priority filter - 10): ct state new jump noep-check
//	chain noep-check
//	    ip daddr . meta l4proto . th dport vmap @noep4                                  (goto reject, or goto drop)
//	    ip daddr @cluster-ips4 goto reject                                              (undefined port of a cluster IP)
//	    ip daddr @service-cidrs4 counter drop                                           (unallocated cluster IP)
//	chain noep-nodeport-check
//	    ip daddr @nodeport-ips4 meta l4proto . th dport vmap @noep-nodeports4
//	chain reject
//	    meta l4proto tcp reject with tcp reset
//	    reject                                                                          (ICMP port unreachable)
//	chain drop
//	    counter drop
//
// @noep4 and @noep-nodeports4 hold the ways into Service ports without
// endpoints (goto reject), or with endpoints on other nodes only under a
// Local policy (goto drop). @service-cidrs4 (flags interval) holds the
// ranges cluster IPs come from: the ServiceCIDR objects' and
// --service-cidr's; a range added or removed changes its elements, never
// a rule (servicecidrs.go).
//
// Source NAT, after routing:
//
//	chain nat-postrouting (priority srcnat)
//	    ip daddr != <cluster CIDR> fib daddr type != local snat ip to ip saddr map @pod-snat4
//	    meta mark & <masq> != 0 meta mark set meta mark & ~<masq> masquerade fully-random
//	    ct status dnat ip saddr . ip daddr @hairpin4 masquerade fully-random
//
// A pod with its own external IP leaves with it (@pod-snat4), marked traffic
// is masqueraded, and so is a pod that reached itself through its Service
// (@hairpin4 holds each endpoint on this node . itself: a pod elsewhere is
// translated on its own node).
//
// Changes by others: the backend listens to the kernel's nftables events
// (watch.go). A transaction that touches the table and was committed from
// a socket that is not one of the backend's own (a deleted endpoint
// element, a flushed Service chain, `nft flush ruleset`) is reported to the
// sync runner, a burst of them once, and the runner repairs the table in
// place with a full sync. Lost events (the socket's buffer overflowed,
// most often with the backend's own large sync) are reported too: the
// runner then compares the whole table with a full sync, which counts as a
// repair only when the events named a change. Check, which compares the
// table's object count and the fixed chains' rules every second, is the
// fallback.
//
// Dispatch is one hash lookup whatever the number of Services (two for a
// way in with source ranges), and an
// endpoint is picked by one numgen (or jhash) and one map lookup: the cost
// of a connection does not grow with the number of Services or endpoints.
package nft
