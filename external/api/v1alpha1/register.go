package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is onehop.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "onehop.io", Version: "v1alpha1"}

// The resources, as the API server serves them.
var (
	LoadBalancerIPPools  = GroupVersion.WithResource("loadbalancerippools")
	BGPPeers             = GroupVersion.WithResource("bgppeers")
	BGPAdvertisements    = GroupVersion.WithResource("bgpadvertisements")
	L2Advertisements     = GroupVersion.WithResource("l2advertisements")
	LoadBalancerWebhooks = GroupVersion.WithResource("loadbalancerwebhooks")
)

// AddToScheme registers the kinds of this package with s.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&LoadBalancerIPPool{}, &LoadBalancerIPPoolList{},
		&BGPPeer{}, &BGPPeerList{},
		&BGPAdvertisement{}, &BGPAdvertisementList{},
		&L2Advertisement{}, &L2AdvertisementList{},
		&LoadBalancerWebhook{}, &LoadBalancerWebhookList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
