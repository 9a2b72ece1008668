#!/bin/sh
# /init of the test VM (copied in by image.sh). Runs every /tests/* binary with
# -test.v and prints, on the serial console:
#   ONEHOP-VM-BEGIN <name>
#   ...the test's output...
#   ONEHOP-VM-END <name> rc=<exit status>
#   ONEHOP-VM-DONE
# then powers off. Kernel command-line options (set by the harness):
#   onehop.run=<regexp>      passed as -test.run
#   onehop.run.<name>=<re>   passed as -test.run to /tests/<name> only
#   onehop.timeout=<dur>     passed as -test.timeout (default 400s)
#   onehop.args=<a,b,...>    extra test flags, comma separated
#   onehop.env=<K=V,...>     environment of the test binaries, comma separated
#   onehop.modules=<m,...>   kernel modules to load beyond /etc/mods (packed by image.sh)
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
export ONEHOP_VM=1 HOME=/tmp TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mkdir -p /run/netns
# A hostname: kube-apiserver labels its identity Lease with it, and
# refuses the kernel's "(none)".
hostname onehop-vm
# Only critical kernel messages on the console: the serial port is slow
# under emulation, and IPVS logs every connection it has no destination for.
echo 2 >/proc/sys/kernel/printk
echo "ONEHOP-VM-BOOTED uptime=$(cut -d' ' -f1 /proc/uptime)s kernel=$(uname -r)"
optmods=""
for o in $(cat /proc/cmdline); do
	case "$o" in onehop.modules=*) optmods=$(echo "${o#onehop.modules=}" | tr ',' ' ') ;; esac
done
for m in $(cat /etc/mods) $optmods; do
	modprobe "$m" 2>/dev/null || echo "ONEHOP-VM-WARN modprobe $m failed"
done
/sbin/ip link set lo up # IPVS refuses destinations while the local FIB table is empty

run="" timeout=400s args=""
for o in $(cat /proc/cmdline); do
	case "$o" in
	onehop.run=*) run=${o#onehop.run=} ;;
	onehop.timeout=*) timeout=${o#onehop.timeout=} ;;
	onehop.args=*) args=$(echo "${o#onehop.args=}" | tr ',' ' ') ;;
	onehop.env=*) for kv in $(echo "${o#onehop.env=}" | tr ',' ' '); do export "$kv"; done ;;
	esac
done
for t in /tests/*; do
	[ -x "$t" ] || continue
	name=${t##*/}
	echo "ONEHOP-VM-BEGIN $name"
	trun=$run
	for o in $(cat /proc/cmdline); do
		case "$o" in onehop.run."$name"=*) trun=${o#onehop.run."$name"=} ;; esac
	done
	if [ -n "$trun" ]; then
		(cd /tmp && "$t" -test.v -test.timeout="$timeout" -test.run="$trun" $args) 2>&1
	else
		(cd /tmp && "$t" -test.v -test.timeout="$timeout" $args) 2>&1
	fi
	echo "ONEHOP-VM-END $name rc=$?"
done
echo "ONEHOP-VM-DONE uptime=$(cut -d' ' -f1 /proc/uptime)s"
poweroff -f
sleep 10
