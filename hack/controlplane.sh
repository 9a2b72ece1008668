#!/usr/bin/env bash
# controlplane.sh builds the real control-plane binaries the end-to-end tests and
# the demo run (kube-apiserver, etcd, kubectl) from their Go modules, as pinned
# in test/tools/go.mod, and prints the directory holding them.
#
# The build happens once per machine: binaries land in
#   ${ONEHOP_CACHE:-/var/cache/onehop}/bin-<hash>
# where <hash> covers test/tools/go.{mod,sum}, the Go version and the build
# flags. A later run only checks that the binaries and their stamp are there.
# Concurrent callers (parallel test packages) serialise on a lock file.
#
# Usage: hack/controlplane.sh            # prints the bin dir on stdout
#        ONEHOP_CACHE=/tmp/c hack/controlplane.sh
# Progress goes to stderr, the directory alone to stdout.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The Go toolchain's usual place, for a root shell whose PATH lacks it.
command -v go >/dev/null || [[ ! -x /usr/local/go/bin/go ]] || PATH="${PATH}:/usr/local/go/bin"

tools="${root}/test/tools"
cache="${ONEHOP_CACHE:-/var/cache/onehop}"

k8s_version="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "${tools}/go.mod")"
if [[ -z "${k8s_version}" ]]; then
	k8s_version="$(awk '$1=="k8s.io/kubernetes" {print $2; exit}' "${tools}/go.mod")"
fi
k8s_minor="$(echo "${k8s_version}" | cut -d. -f2)"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${k8s_minor} -X k8s.io/component-base/version.gitTreeState=clean"

# The stamp names everything that changes the output.
stamp="$(
	cat "${tools}/go.mod" "${tools}/go.sum"
	go version
	echo "ldflags=${ldflags} CGO_ENABLED=0 -trimpath"
)"
hash="$(printf '%s' "${stamp}" | sha256sum | cut -c1-16)"
bin="${cache}/bin-${hash}"
binaries=(kube-apiserver etcd kubectl)

complete() {
	[[ -f "${bin}/STAMP" ]] && [[ "$(cat "${bin}/STAMP")" == "${stamp}" ]] || return 1
	local b
	for b in "${binaries[@]}"; do [[ -x "${bin}/${b}" ]] || return 1; done
}

if complete; then
	echo "${bin}"
	exit 0
fi

mkdir -p "${cache}"
exec 9>"${cache}/.build.lock"
flock 9
if complete; then # someone else built it while we waited
	echo "${bin}"
	exit 0
fi

tmp="$(mktemp -d "${cache}/.build-${hash}.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
echo "controlplane: building kube-apiserver, etcd, kubectl (k8s ${k8s_version}) into ${bin}; the first build takes many minutes" >&2
start=$(date +%s)
(
	cd "${tools}"
	export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
	go build -trimpath -ldflags="${ldflags}" -o "${tmp}/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	go build -trimpath -ldflags="${ldflags}" -o "${tmp}/kubectl" k8s.io/kubernetes/cmd/kubectl
	go build -trimpath -ldflags="-s -w" -o "${tmp}/etcd" go.etcd.io/etcd/server/v3
)
printf '%s' "${stamp}" >"${tmp}/STAMP"
chmod 755 "${tmp}"
rm -rf "${bin}"
mv "${tmp}" "${bin}"
trap - EXIT
echo "controlplane: built in $(($(date +%s) - start))s" >&2
echo "${bin}"
