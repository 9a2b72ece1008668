// Package node runs real Kubernetes nodes for the tests: a control plane
// (etcd, kube-apiserver with Node authorization and an audit log,
// kube-controller-manager, kube-scheduler) and kubelets with Debian's
// containerd, runc and CNI plugins. Every part runs in network namespaces
// the test creates; each node has a private mount namespace, so what its
// containerd and kubelet mount goes with it. Images are built locally
// (WriteImage, go-containerregistry) and imported into containerd: there is
// no registry. The Kubernetes binaries come from hack/controlplane.sh node.
//
// Its tests deploy the shipped manifests (deploy/) on such nodes.
package node
