#!/usr/bin/env bash
# controlplane.sh builds the real Kubernetes binaries the end-to-end tests and
# the demo run, from their Go modules as pinned in test/tools/go.mod, and
# prints the directory holding them. Sets:
#   controlplane (default)  kube-apiserver, etcd, kubectl
#   node                    and kubelet, kube-controller-manager,
#                           kube-scheduler, kube-proxy, agnhost (test/node)
#   conformance             and e2e.test (upstream's Services tests), the ginkgo
#                           CLI that runs it in parallel, regression-issue-74839
#                           (a test image's server) and coredns
#                           (test/tools/coredns, the cluster DNS)
#
# The build happens once per machine: binaries land in
#   ${ONEHOP_CACHE:-/var/cache/onehop}/bin-<hash>
# where <hash> covers test/tools/go.{mod,sum}, the Go version and the build
# flags; a set builds only what the directory lacks. A later run only checks
# that the binaries and their stamp are there. Concurrent callers (parallel
# test packages) serialise on a lock file.
#
# Usage: hack/controlplane.sh [set]      # prints the bin dir on stdout
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
	cat "${tools}/go.mod" "${tools}/go.sum" "${tools}/coredns/go.mod" "${tools}/coredns/go.sum" "${tools}/coredns/main.go"
	go version
	echo "ldflags=${ldflags} CGO_ENABLED=0 -trimpath"
)"
hash="$(printf '%s' "${stamp}" | sha256sum | cut -c1-16)"
bin="${cache}/bin-${hash}"
want="${1:-controlplane}"
binaries=(kube-apiserver etcd kubectl)
case "${want}" in
controlplane) ;;
node) binaries+=(kubelet kube-controller-manager kube-scheduler kube-proxy agnhost) ;;
conformance) binaries+=(kubelet kube-controller-manager kube-scheduler kube-proxy agnhost e2e.test ginkgo regression-issue-74839 coredns) ;;
*)
	echo "controlplane.sh: unknown set ${want} (controlplane, node, conformance)" >&2
	exit 2
	;;
esac

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

# A stamp that does not match means other sources: start afresh.
if [[ -d "${bin}" ]] && [[ "$(cat "${bin}/STAMP" 2>/dev/null)" != "${stamp}" ]]; then
	rm -rf "${bin}"
fi
mkdir -p "${bin}"
tmp="$(mktemp -d "${cache}/.build-${hash}.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
build() { # build <binary>: into ${tmp}, then moved in place
	local b=$1
	case "${b}" in
	etcd) go build -trimpath -ldflags="-s -w" -o "${tmp}/etcd" go.etcd.io/etcd/server/v3 ;;
	agnhost) go build -trimpath -ldflags="-s -w" -o "${tmp}/agnhost" k8s.io/kubernetes/test/images/agnhost ;;
	regression-issue-74839) go build -trimpath -ldflags="-s -w" -o "${tmp}/${b}" "k8s.io/kubernetes/test/images/${b}" ;;
	ginkgo) go build -trimpath -ldflags="-s -w" -o "${tmp}/ginkgo" github.com/onsi/ginkgo/v2/ginkgo ;;
	coredns) (cd coredns && go build -trimpath -ldflags="-s -w" -o "${tmp}/coredns" .) ;;
	e2e.test) go test -c -trimpath -ldflags="${ldflags}" -o "${tmp}/e2e.test" k8s.io/kubernetes/test/e2e ;;
	*) go build -trimpath -ldflags="${ldflags}" -o "${tmp}/${b}" "k8s.io/kubernetes/cmd/${b}" ;;
	esac
	mv "${tmp}/${b}" "${bin}/${b}"
}
start=$(date +%s)
for b in "${binaries[@]}"; do
	[[ -x "${bin}/${b}" ]] && continue
	echo "controlplane: building ${b} (k8s ${k8s_version}) into ${bin}; a first build takes minutes" >&2
	(
		cd "${tools}"
		export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
		build "${b}"
	)
done
printf '%s' "${stamp}" >"${bin}/STAMP"
chmod 755 "${bin}"
echo "controlplane: ${want} ready in $(($(date +%s) - start))s" >&2
echo "${bin}"
