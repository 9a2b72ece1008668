#!/usr/bin/env bash
# demo.sh: `make demo` and `make demo-down`.
#
#   hack/demo.sh up     build what is needed (control plane once per machine,
#                       the agent, the demo driver), bring a namespace cluster
#                       up, send a request from an external client through a
#                       LoadBalancer IP, print the agent's rules, tear down.
#                       DEMO_HOLD=1 keeps the cluster up until Ctrl-C or
#                       `make demo-down`.
#   hack/demo.sh down   stop a held demo, delete namespaces left behind.
#
# Needs root: it creates network namespaces, veth pairs, bridges and nftables
# tables, all inside namespaces of its own; nothing in the host's namespace.
set -euo pipefail

cmd="${1:-up}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"

if [[ "$(id -u)" != 0 ]]; then
	cat >&2 <<'MSG'
make demo needs root. It creates network namespaces, veth pairs, bridges and
nftables tables (only inside namespaces of its own, never in the host's), and
installs iproute2, nftables and conntrack with apt-get when they are missing.
Run it as root:   sudo make demo        (and sudo make demo-down)
It also needs Go (see go.mod for the version) on root's PATH.
MSG
	exit 2
fi
# The Go toolchain's usual place, for a root shell whose PATH lacks it.
command -v go >/dev/null || [[ ! -x /usr/local/go/bin/go ]] || PATH="${PATH}:/usr/local/go/bin"
command -v go >/dev/null || {
	echo "make demo needs the Go toolchain on PATH (see go.mod for the version)" >&2
	exit 2
}

"${root}/hack/ci-deps.sh"

work="${ONEHOP_CACHE:-/var/cache/onehop}/demo"
mkdir -p "${work}"
echo "==> Building the demo driver" >&2
go build -o "${work}/demo" ./test/netns/cmd/demo

case "${cmd}" in
down)
	exec "${work}/demo" down
	;;
up) ;;
*)
	echo "usage: $0 up|down" >&2
	exit 2
	;;
esac

echo "==> Control plane binaries (built from their Go modules once per machine; the first time takes a while)" >&2
bin="$("${root}/hack/controlplane.sh")"
echo "==> Building the agent" >&2
go build -o "${work}/agent" ./cmd/agent

ONEHOP_CONTROLPLANE_BIN="${bin}" ONEHOP_AGENT="${work}/agent" exec "${work}/demo" up
