#!/usr/bin/env bash
# ci-deps.sh installs the Debian packages the tests and the demo need:
# iproute2 (ip netns, veth, bridges), bird2 (the BGP peer of test/external),
# nftables (nft, for debugging output and
# rule dumps), conntrack (flow-table inspection), procps, util-linux (flock),
# kmod (modprobe) and iptables (the kube-proxy leftovers that `agent cleanup`
# removes are made with it); for test/node's real nodes: containerd, runc,
# containernetworking-plugins, and the userland of its agnhost image (curl,
# netcat-openbsd, bind9-dnsutils, wget). Idempotent: it does nothing, quietly, when everything is
# present, and runs `apt-get update` at most once otherwise.
set -euo pipefail

pkgs=(iproute2 nftables conntrack procps ca-certificates util-linux kmod bird2 iptables
	containerd runc containernetworking-plugins curl netcat-openbsd bind9-dnsutils wget)

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("${p}")
	fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ "$(id -u)" != 0 ]]; then
	echo "ci-deps: missing packages ${missing[*]}; run as root (or: sudo apt-get install ${missing[*]})" >&2
	exit 1
fi
echo "ci-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
	apt-get install -y -q --no-install-recommends "${missing[@]}"
