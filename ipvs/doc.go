// Package ipvs is onehop's IPVS dataplane: the same Portals as the nftables
// backend, programmed as IPVS virtual servers (github.com/moby/ipvs over
// generic netlink) plus the few iptables rules IPVS cannot express
// (github.com/coreos/go-iptables).
//
// # What it programs
//
//   - One virtual server per way into a Service port: each cluster IP,
//     external IP and load-balancer IP at the Service port, and each NodePort
//     address (portal.Node.NodePortAddrs, or every global unicast address of
//     the node) at the NodePort. Destinations are the endpoints in
//     masquerade (NAT) forwarding, weight 1. Cluster IPs use
//     ClusterEndpoints, or LocalEndpoints under internalTrafficPolicy Local;
//     external entries use LocalEndpoints under externalTrafficPolicy Local.
//     The scheduler is the Service's onehop.io/scheduler annotation, else the
//     backend's (WithScheduler, default rr);
//     sessionAffinity ClientIP is IPVS persistence with the affinity timeout.
//   - Every cluster, external and load-balancer IP as a /32 (/128) on the
//     dummy interface onehop-ipvs0, so the kernel delivers their packets
//     locally, where IPVS takes them.
//   - iptables, only in chains named ONEHOP-IPVS-*, plus jumps from nat
//     POSTROUTING, filter INPUT (two) and filter OUTPUT:
//     ONEHOP-IPVS-POSTROUTING decides masquerade for packets IPVS scheduled
//     (xt_ipvs match) with the masquerade mark bit: set by default when
//     ClusterCIDRs are known (or MasqueradeAll), cleared for sources inside the
//     cluster networks, set for Cluster-policy external entries when no
//     cluster CIDR is known (ONEHOP-IPVS-MASQ-EXT), cleared for Local-policy
//     external entries so the endpoint sees the client (ONEHOP-IPVS-KEEP-SOURCE),
//     set for an endpoint reaching itself (ONEHOP-IPVS-HAIRPIN); then what is
//     marked is masqueraded. ONEHOP-IPVS-INPUT drops load-balancer (and,
//     with SourceRangesOnNodePorts, NodePort) traffic of Services with
//     loadBalancerSourceRanges whose source is not in the Service's set:
//     one rule per entry, `-m set ! --match-set ONEHOP-RANGES-<hash> src`,
//     whatever the number of ranges. Filter INPUT runs before IPVS's
//     LOCAL_IN hook, so dropped packets never reach IPVS. The node's own
//     connections never pass INPUT (IPVS takes them at LOCAL_OUT), so
//     ONEHOP-IPVS-OUTPUT drops the ones IPVS scheduled to such an entry
//     (`-m ipvs --vaddr`, filter OUTPUT runs after IPVS there) whose source
//     is not in the set, unless one of the node's addresses is inside the
//     ranges: then the node may connect, as with kube-proxy (kubernetes
//     #119656). The set match keeps allowed clients' packets, which IPVS
//     sends on through OUTPUT too.
//   - The Service IP filter (filter.go): ONEHOP-IPVS-FILTER, from filter
//     INPUT, rejects new connections to a Service IP at a port that is not
//     one of its virtual servers (ipsets ONEHOP-IPVS-VIPS and
//     ONEHOP-IPVS-PORTS, and their IPv6 twins), so that a listener of the
//     node's (sshd, the kubelet) is not reachable through a cluster,
//     external or load-balancer IP, from anywhere, the node included
//     (kube-proxy's KUBE-IPVS-FILTER, kubernetes #72236).
//   - One ipset (hash:net) per Service and family with source ranges,
//     named ONEHOP-RANGES-<hash of the Service and family>, created,
//     changed and destroyed over netfilter netlink (needs the ip_set,
//     ip_set_hash_net and xt_set modules). A change of ranges adds and
//     deletes only the changed elements, up to 1000 in one message; a set
//     no rule uses any more is destroyed once the kernel has released the
//     rule's reference. Chains named ONEHOP-SR-* (a chain of rules per entry, from
//     older versions) are removed by the first full sync.
//   - No rule for "no endpoints": a virtual server without a usable
//     destination makes IPVS answer ICMP port unreachable itself, which is
//     the same reject the nft backend sends (TCP clients get ECONNREFUSED).
//     Such Services keep their virtual server, so Dump shows them with the
//     note "no endpoints: new connections are rejected", as nft.
//
// # Syncing
//
// Sync keeps the desired plan (plan.go; pure, rendered into
// testdata/*.golden) in memory, with what each Service contributed. A full
// sync builds it from the whole snapshot and diffs it against what it reads
// back from the kernel (IPVS services and destinations, the dummy's
// addresses, `iptables -S` of onehop's chains compared in iptables'
// canonical form, the elements of onehop's ipsets). An incremental sync replaces only the dirty Services'
// parts (plus Services that lost an entry to another, so a freed entry is
// taken) and diffs only the keys they had or now have: about 10 us of
// planning for one change among 10k Services, then the netlink messages and
// at most one iptables-restore --noflush per table (one transaction, one
// process). It never flushes and reloads. IPVS itself has no transactions,
// so a failed sync can leave part of a change applied; the next sync is
// then full and converges. A change of the node's NodePort addresses or the
// first IPv6 Service makes a sync full.
//
// One Service's trouble is that Service's, never the node's. The
// onehop.io/scheduler annotation names a scheduler; the first sync that
// meets one asks the kernel for it once, with a throwaway firewall-mark
// virtual server, and remembers the answer (a full sync asks again about
// refused ones). A Service asking for one the kernel cannot load gets the
// backend's scheduler and an InvalidScheduler event, before anything is
// sent. A virtual server the kernel refuses all the same is left out, the
// others are programmed, its Service gets a VirtualServerFailed event
// (SyncStats.Problems, through the runner, once while it lasts; the
// metric onehop_service_dataplane_problems_total counts them), and every
// later sync tries it again. Errors that are the node's (netlink failing,
// no memory) still fail the sync. A virtual server that exists already at
// a Service's address, port and protocol without onehop knowing it
// (kube-proxy's IPVS mode leaves them behind, see docs/migration.md; a lost
// state file hides onehop's own NodePort ones) is adopted, as kube-proxy
// does: updated to the Service's settings, its destinations kept when
// wanted and drained otherwise. Virtual servers at other addresses and
// ports are never touched.
//
// Graceful termination: a TCP or SCTP destination that leaves the endpoints
// gets weight 0 (no new connections, established ones keep working) and is
// deleted once IPVS counts no connection for it, or after the drain timeout
// (WithDrainTimeout, default 2 minutes). Check and Sync reap. The hashing
// schedulers (sh, mh) get IPVS's fallback flag (sh-fallback, mh-fallback):
// without it, a client whose hash lands on a draining destination is
// refused for as long as it drains, instead of going to another. UDP
// destinations are deleted at once (flows have no end; expire_nodest_conn
// moves them on their next packet). A destination that comes back while
// draining returns to weight 1.
//
// IPVS keeps no names, so the backend records which Service port each
// virtual server belongs to in a small state file (WithStateFile, default
// /run/onehop/ipvs-services.json, rewritten only when it changes). A
// restarted agent (and `agent dump-rules`, `agent cleanup`) reads it to
// recognise NodePort virtual servers, which are on node addresses rather
// than on the dummy interface; deploy/ipvs mounts the host's /run/onehop
// there, so it outlives the pod and is gone at reboot, like IPVS state.
// Within one process the names are in memory: a state file that cannot be
// written is logged once and never fails a sync. Every count, weight and
// address still comes from the kernel.
//
// Drift: Check reads the dummy interface over netlink on every call, and
// runs `iptables -C` on the jumps only once per canary period
// (WithCanaryPeriod, default a minute, as kube-proxy's canary), because
// every iptables command takes the node-wide xtables lock.
//
// # Sysctls, and why
//
// The first full sync sets, in the backend's network namespace:
//
//   - net.ipv4.vs.conntrack=1: IPVS then keeps conntrack entries for its
//     connections. Without them the nat POSTROUTING MASQUERADE never sees
//     IPVS traffic, and replies from endpoints on other nodes, sent straight
//     to a client outside the cluster network, are dropped by the client.
//   - net.ipv4.vs.conn_reuse_mode=1 on kernels 5.9 and later, 0 before.
//     With 0, a new connection that reuses the source port of an old one is
//     sent to the old one's destination, even one at weight 0 or removed:
//     traffic keeps going to terminated pods under port reuse (kube-proxy
//     #93297, where kube-proxy stopped forcing 0 on fixed kernels). With 1
//     and conntrack=1, kernels before 5.9 dropped the first SYN of such a
//     connection, adding a one-second delay under load (kube-proxy #81775,
//     #70747), which is why 0 is still right there.
//   - net.ipv4.vs.expire_nodest_conn=1: when a destination is deleted, the
//     next packet of one of its connections expires the connection at once
//     instead of being dropped until the connection times out (minutes of
//     hanging clients after a pod is gone).
//   - net.ipv4.vs.expire_quiescent_template=1: a persistence (affinity)
//     template pointing at a weight-0 destination expires, so clients with
//     affinity to a terminating pod move to a live one.
//   - net.ipv4.conf.all.arp_ignore=1 and arp_announce=2 (kube-proxy's
//     strictARP): every VIP is a local address on onehop-ipvs0, and Linux by
//     default answers ARP for any local address on any interface. Without
//     these, every node would claim every cluster, external and load-balancer
//     IP on the LAN, fighting whatever really announces them (MetalLB L2,
//     onehop's own L2 announcer, a router). arp_ignore=1 answers only for
//     addresses of the receiving interface; arp_announce=2 uses the best
//     local source address in ARP requests, never a VIP. IPv6 needs nothing:
//     neighbour solicitations are answered only for addresses of the
//     receiving interface, and the dummy is NOARP.
//
// # Namespaces
//
// Netlink sockets are opened in the network namespace of the thread calling
// New; iptables commands and sysctls act in the namespace of the thread
// calling Sync, Check, Dump or Cleanup. The agent runs everything in the
// host namespace; tests run a backend in a throwaway namespace by calling
// it from a thread locked there.
//
// # Differences from the nft backend
//
//   - Traffic from the node itself or from pods to an external entry of a
//     Local-policy Service goes to the local endpoints only (the same
//     virtual server serves everyone); the nft backend can short-circuit
//     such traffic to all endpoints.
//   - Every VIP is a local address of the node; the Service IP filter
//     rejects what is not a Service port (nft never delivers such packets
//     locally).
//   - No-endpoint and Local-without-local-endpoint traffic is rejected with
//     ICMP port unreachable by IPVS (nft drops the latter).
//   - iptables rule counts grow with Local-policy external entries,
//     source-range entries (not with the ranges, which are in ipsets) and
//     local endpoints, not with Services; the nft backend keeps everything
//     in sets and maps.
package ipvs
