// Package nft is onehop's nftables backend. It owns one table, `inet onehop`,
// and programs it over netlink (github.com/google/nftables) in one atomic
// transaction per sync, keeping what it applied in memory so that a change
// to one Service sends only that Service's map elements and chains.
//
// The ruleset (see testdata/*.golden for a rendered example):
//
//	nat-prerouting, nat-output (nat, dstnat): jump services
//	services:
//	    ip  daddr . meta l4proto . th dport vmap @vips4   (cluster, external and LB IPs)
//	    ip6 daddr . meta l4proto . th dport vmap @vips6
//	    ip  daddr @nodeport-ips4 meta l4proto . th dport vmap @nodeports4
//	    ip6 daddr @nodeport-ips6 meta l4proto . th dport vmap @nodeports6
//	svc<f>/<ns>/<name>/<proto>/<port>:   one per Service port and family
//	    jump masq-outside          (mark traffic from outside the cluster CIDRs)
//	    counter dnat to numgen random mod N map { 0 : pod . port, ... }
//	ext<f>/...: the way in for NodePort, external and LB IPs
//	    meta mark set mark | masq; goto svc<f>/...
//	nat-postrouting (nat, srcnat):
//	    mark & masq != 0: clear the bit, masquerade fully-random
//	    ct status dnat, saddr . daddr in @hairpin<f>: masquerade (a pod reaching itself)
//	filter-input, filter-forward, filter-output (filter - 10):
//	    ct state new: jump noep-check
//	noep-check: daddr . l4proto . dport in @noep<f>, or a NodePort in
//	    @noep-nodeports<f>: goto reject (TCP reset, ICMP port unreachable)
//
// Dispatch is one hash lookup whatever the number of Services, and an
// endpoint is picked by one numgen + map lookup: connection cost does not grow
// with the number of Services or endpoints.
package nft
