// Package v1alpha1 holds the onehop.io/v1alpha1 custom resources that
// configure the cloud hook (package external): LoadBalancerIPPool,
// BGPPeer, BGPAdvertisement, L2Advertisement and LoadBalancerWebhook. They
// are cluster-scoped; each has status.conditions (Accepted or Invalid,
// written by the controller alone), and pools also count their used and
// free addresses.
//
// The CRD manifests in deploy/base/crds and zz_generated.deepcopy.go are
// generated from these types by controller-gen (`make generate`); the
// markers on the fields are their OpenAPI validation and CEL rules.
//
// It must not import package external or any of its other subpackages:
// they read these types.
//
// +kubebuilder:object:generate=true
// +groupName=onehop.io
package v1alpha1
