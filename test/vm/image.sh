#!/usr/bin/env bash
# image.sh prepares everything a test VM boots: a Debian cloud kernel that has
# IPVS (its .deb fetched with `apt-get download`, never installed on the host)
# and an initramfs holding busybox, iproute2's ip, iptables, ipset, ipvsadm,
# the kernel modules the tests need, the statically built test binaries given
# on the command line, and the other files given there (what a guest package
# needs beyond its test binary, e.g. a control plane). The guest's /init loads the modules, runs every test
# binary with -test.v, prints its exit status between markers on the serial
# console and powers off (see init.sh).
#
# Usage (root): test/vm/image.sh OUTDIR name=/path/to/pkg.test [...] [/guest/path=/host/path ...]
#   a name is a test binary (/tests/name in the guest); an absolute guest path
#   is any other file, packed uncompressed (large static binaries unpack
#   faster so than gunzipped under emulation).
#   prints two lines on stdout: "kernel=<vmlinuz path>" and "initrd=<path>".
#   Progress goes to stderr.
#
# Cached in ${ONEHOP_CACHE:-/var/cache/onehop}/vm (kept across runs):
#   debs/<pkg>.deb          the kernel package as downloaded
#   k-<version>/            its extracted tree (vmlinuz, modules, depmod'ed)
#   kernel.pkg              the package name last resolved (offline fallback)
# Environment:
#   ONEHOP_VM_KERNEL   kernel package to use (default: what linux-image-cloud-amd64 depends on;
#                      when apt cannot resolve it, the last cached one)
#   ONEHOP_VM_IPTABLES nft (default) or legacy: the iptables variant /sbin/iptables is in the guest
#
# Host packages are installed with apt-get when missing (idempotent; `apt-get update` at most once).
set -euo pipefail

out=${1:?usage: image.sh OUTDIR name=/path/to/test.binary ...}
shift
cache="${ONEHOP_CACHE:-/var/cache/onehop}/vm"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
variant=${ONEHOP_VM_IPTABLES:-nft}
log() { echo "vm-image: $*" >&2; }
mkdir -p "$cache" "$out"

# Only one builder touches the cache at a time (parallel go test packages).
exec 9>"$cache/.lock"
flock 9

# 1. Host tools, all Debian packages. iptables provides both xtables variants
#    and the extensions (libxt_ipvs.so and friends) we copy into the guest.
updated=""
need=()
for p in qemu-system-x86:/usr/bin/qemu-system-x86_64 busybox-static:/bin/busybox cpio:/usr/bin/cpio \
	kmod:/usr/sbin/depmod ipvsadm:/usr/sbin/ipvsadm iproute2:/usr/sbin/ip ipset:/usr/sbin/ipset \
	iptables:/usr/sbin/xtables-nft-multi; do
	[[ -x "${p#*:}" ]] || need+=("${p%%:*}")
done
if ((${#need[@]})); then
	log "installing ${need[*]}"
	apt-get update -qq >&2
	updated=1
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# 2. The kernel. Resolve the meta package to a versioned one; reuse the cached
#    extraction when it is there.
pkg=${ONEHOP_VM_KERNEL:-}
resolve() { apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
if [[ -z "$pkg" ]]; then
	pkg=$(resolve)
	if [[ -z "$pkg" && -z "$updated" && ! -s "$cache/kernel.pkg" ]]; then
		apt-get update -qq >&2 && pkg=$(resolve)
	fi
	[[ -n "$pkg" ]] || pkg=$(cat "$cache/kernel.pkg" 2>/dev/null || true)
fi
[[ -n "$pkg" ]] || { log "cannot resolve a linux-image-cloud-amd64 kernel package"; exit 1; }
kver=${pkg#linux-image-}
kdir="$cache/k-$kver"
if [[ ! -f "$kdir/.done" ]]; then
	mkdir -p "$cache/debs"
	if ! ls "$cache/debs/${pkg}"_*.deb >/dev/null 2>&1; then
		log "downloading $pkg"
		(cd "$cache/debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) || {
			[[ -n "$updated" ]] || { apt-get update -qq >&2 && (cd "$cache/debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2); }
		}
	fi
	rm -rf "$kdir.tmp"
	dpkg-deb -x "$(ls "$cache/debs/${pkg}"_*.deb | head -n1)" "$kdir.tmp"
	depmod -b "$kdir.tmp" "$kver"
	rm -rf "$kdir"
	mv "$kdir.tmp" "$kdir"
	touch "$kdir/.done"
fi
echo "$pkg" >"$cache/kernel.pkg"

# 3. The initramfs: a base archive (tools, libraries, modules, /init) cached
#    per kernel, tool versions and these scripts, plus a small archive of the
#    test binaries built each run. The kernel unpacks concatenated archives.
stamp=$(
	echo "$pkg $variant"
	dpkg-query -W -f='${Package}=${Version}\n' busybox-static iproute2 iptables ipset ipvsadm libc6 2>/dev/null
	cat "${BASH_SOURCE[0]}" "$here/init.sh"
)
base="$cache/base-$(printf '%s' "$stamp" | sha256sum | cut -c1-16).cpio.gz"
if [[ ! -s "$base" ]]; then
R="$out/rootfs"
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,etc,tests,lib64}
cp /bin/busybox "$R/bin/busybox"
for a in $(/bin/busybox --list); do [[ "$a" == busybox ]] || ln -sf busybox "$R/bin/$a"; done
# The kernel's request_module() helper loads schedulers (ip_vs_<sched>) and
# xtables extensions on demand.
ln -sf /bin/busybox "$R/sbin/modprobe"
cplibs() { # the shared libraries of ELF file $1
	ldd "$1" 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*' | while read -r l; do
		[[ -e "$R$l" ]] && continue
		mkdir -p "$R$(dirname "$l")"
		cp -L "$l" "$R$l"
	done
}
cpbin() { # host binary $1 to guest path $2, with its libraries
	cp -L "$1" "$R$2"
	cplibs "$1"
}
cpbin /usr/sbin/ip /sbin/ip
cpbin /usr/sbin/ipvsadm /sbin/ipvsadm
cpbin /usr/sbin/ipset /sbin/ipset # kube-proxy's IPVS mode runs it
cpbin /usr/sbin/xtables-nft-multi /sbin/xtables-nft-multi
cpbin /usr/sbin/xtables-legacy-multi /sbin/xtables-legacy-multi
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	ln -sf "xtables-$variant-multi" "$R/sbin/$t"
done
# xtables extensions are dlopen()ed, so ldd of the binary does not list them.
xt=/usr/lib/x86_64-linux-gnu/xtables
mkdir -p "$R$xt"
cp "$xt"/*.so "$R$xt/"
for f in "$xt"/*.so; do cplibs "$f"; done
# go-iptables takes the xtables lock; iproute2 wants /etc/iproute2 only for names.
mkdir -p "$R/run/netns" "$R/etc/iproute2"
echo "root:x:0:0:root:/:/bin/sh" >"$R/etc/passwd"
echo "root:x:0:" >"$R/etc/group"
echo "hosts: files" >"$R/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$R/etc/hosts"
# ipset resolves protocol names (kube-proxy's "10.96.0.1,tcp:443").
cp /etc/protocols "$R/etc/protocols"

mods="dummy veth nf_conntrack nf_nat sctp nft_numgen
ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_sh ip_vs_mh ip_vs_dh
ip_set ip_set_hash_net ip_set_hash_ipport xt_set
ip_set_hash_ip ip_set_hash_ipportip ip_set_hash_ipportnet ip_set_bitmap_port nf_conntrack_netlink
x_tables xt_mark xt_comment xt_ipvs xt_tcpudp xt_multiport xt_addrtype xt_conntrack xt_MASQUERADE xt_nat xt_sctp
ip_tables iptable_nat iptable_filter iptable_mangle ipt_REJECT nf_reject_ipv4
ip6_tables ip6table_nat ip6table_filter ip6table_mangle ip6t_REJECT nf_reject_ipv6
nf_tables nft_compat nft_chain_nat nft_ct nft_masq nft_nat nft_reject nft_reject_inet nft_fib_inet"
# Packed but loaded only when the kernel command line asks (onehop.modules,
# init.sh): bridges with netfilter on bridged traffic, as the differential
# tester's twin nodes have on the host, would change what other tests see
# (kube-proxy's IPVS mode matches on the bridge port, xt_physdev);
# xfrm_user lets the agent's netlink handle open its XFRM socket.
optmods="bridge br_netfilter xt_physdev xfrm_user"
kmod="$kdir/lib/modules/$kver"
for m in $mods $optmods; do
	deps=$(modprobe -d "$kdir" -S "$kver" --show-depends "$m" 2>/dev/null | awk '/^insmod/{print $2}') || true
	[[ -n "$deps" ]] || { log "module $m: not in $pkg (builtin or absent)"; continue; }
	for p in $deps; do
		rel=${p#*/lib/modules/$kver/}
		mkdir -p "$R/lib/modules/$kver/$(dirname "$rel")"
		cp "$p" "$R/lib/modules/$kver/$rel"
	done
done
cp "$kmod"/modules.{order,builtin,builtin.modinfo} "$R/lib/modules/$kver/"
depmod -b "$R" "$kver"
echo $mods >"$R/etc/mods"

cp "$here/init.sh" "$R/init"
chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) >"$base.tmp"
mv "$base.tmp" "$base"
rm -rf "$R"
find "$cache" -maxdepth 1 -name 'base-*.cpio.gz' ! -newer "$base" ! -path "$base" -mmin +60 -delete 2>/dev/null || true
fi

T="$out/tests-root" X="$out/extra-root"
rm -rf "$T" "$X"
mkdir -p "$T/tests" "$X"
for arg in "$@"; do
	name=${arg%%=*}
	case "$name" in
	/*)
		mkdir -p "$X$(dirname "$name")"
		cp "${arg#*=}" "$X$name"
		;;
	*)
		cp "${arg#*=}" "$T/tests/$name"
		chmod +x "$T/tests/$name"
		;;
	esac
done
(cd "$T" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/tests.cpio.gz"
cat "$base" "$out/tests.cpio.gz" >"$out/initramfs.gz.tmp"
if [[ -n "$(ls -A "$X")" ]]; then
	# The kernel reads an uncompressed archive only at a 4-byte boundary
	# after a compressed one; NULs between archives are skipped.
	pad=$(((4 - $(stat -c %s "$out/initramfs.gz.tmp") % 4) % 4))
	head -c "$pad" /dev/zero >>"$out/initramfs.gz.tmp"
	(cd "$X" && find . | cpio -o -H newc --quiet) >>"$out/initramfs.gz.tmp"
fi
mv "$out/initramfs.gz.tmp" "$out/initramfs.gz"
rm -rf "$T" "$X" "$out/tests.cpio.gz"
log "kernel $kver, initramfs $(du -h "$out/initramfs.gz" | cut -f1) (base $(basename "$base"))"
echo "kernel=$kdir/boot/vmlinuz-$kver"
echo "initrd=$out/initramfs.gz"
