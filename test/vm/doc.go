// Package vm boots a real IPVS-capable Linux kernel under qemu and runs
// onehop's kernel-facing test binaries inside it.
//
// The host kernel of the development machines and CI has no IPVS, so
// TestIPVSInVM builds the test binaries of the packages in GuestPackages
// statically (CGO_ENABLED=0 go test -c), packs them with busybox, iproute2,
// iptables, ipvsadm and the needed kernel modules into an initramfs
// (image.sh), boots a Debian cloud kernel under qemu-system-x86_64 (TCG, no
// network card) and reads the guests' `go test -v` output and exit codes
// back from the serial console (init.sh prints them between markers).
//
// A guest package may need more than its test binary (needs_test.go): the
// differential tester's IPVS comparison (./test/difftest) brings etcd,
// kube-apiserver, kube-proxy and a static agent into the initramfs, loads
// the bridge modules, and gets 4 GiB of memory and up to two hours (go
// test's -timeout still applies); only a run that selects it pays for that.
//
// The kernel .deb and its extracted modules are cached under
// ${ONEHOP_CACHE:-/var/cache/onehop}/vm; missing host packages are installed
// with apt-get. Environment knobs:
//
//	ONEHOP_VM_PACKAGES=p[:re],...
//	                          run these guest packages instead of GuestPackages,
//	                          e.g. ./test/difftest:TestDifferentialIPVS
//	ONEHOP_VM_RUN=regexp      only run matching guest tests (-test.run)
//	ONEHOP_VM_KERNEL=pkg      pin the kernel package (linux-image-6.1.0-…-cloud-amd64)
//	ONEHOP_VM_IPTABLES=legacy use iptables-legacy in the guest (default nft)
//	ONEHOP_VM_REQUIRED=1      fail instead of skipping when qemu cannot run
//	ONEHOP_VM_ACCEL=tcg       do not try KVM first (a nested KVM may run a
//	                          guest far slower than TCG does)
//	ONEHOP_CHURN_SEED=N, ONEHOP_CHURN_SECONDS=S
//	                          passed to the guest: replay or lengthen the IPVS
//	                          churn test (ipvs TestChurn; its seed is printed)
//	ONEHOP_DIFFTEST_CASES=N, ONEHOP_DIFFTEST_SEED=S
//	                          passed to the guest: the IPVS comparison's size
//	                          and first seed
package vm
