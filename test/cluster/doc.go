// Package cluster starts a real Kubernetes control plane for end-to-end
// tests: etcd and kube-apiserver as separate processes, built from their Go
// modules by hack/controlplane.sh, running inside a given network namespace.
// At start-up it generates a CA, serving certificates with IP SANs for the
// apiserver's address, a service-account signing key and an admin kubeconfig
// (client certificate in group system:masters), and waits for /readyz.
// Stop kills the processes and removes every file it wrote.
package cluster
