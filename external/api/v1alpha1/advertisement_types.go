package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// PoolSelection picks pools by name or by their labels. Empty, it picks
// every address the hook announces: every pool's, and the spec.externalIPs
// and pod external IPs outside pools.
type PoolSelection struct {
	// IPAddressPools are pool names.
	//
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	IPAddressPools []string `json:"ipAddressPools,omitempty"`
	// IPAddressPoolSelectors pick the pools whose labels match one of them.
	//
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	IPAddressPoolSelectors []metav1.LabelSelector `json:"ipAddressPoolSelectors,omitempty"`
}

// BGPAdvertisement says which addresses the nodes announce over BGP, and
// from which nodes. While there is none, every address is announced to
// every peer (as the configuration file's bgp section does); once one is
// accepted, an address is announced from a node only when an accepted
// advertisement picks both.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=onehop
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BGPAdvertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BGPAdvertisementSpec `json:"spec,omitempty"`
	Status AdvertisementStatus  `json:"status,omitempty"`
}

// BGPAdvertisementSpec picks pools and nodes, and the attributes of the
// routes they announce.
type BGPAdvertisementSpec struct {
	PoolSelection `json:",inline"`
	// NodeSelectors pick the nodes that announce; empty, every node.
	//
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	NodeSelectors []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
	// AggregationLength is the length of the IPv4 prefix announced for an
	// address: 32 (the default) announces the address alone; a shorter
	// one announces the prefix that holds it, once for all of a node's
	// addresses in it. Every pool the advertisement picks must hold whole
	// prefixes of that length, so that no router sends a node traffic for
	// an address outside the pools.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	// +optional
	AggregationLength *int32 `json:"aggregationLength,omitempty"`
	// AggregationLengthV6 is AggregationLength for IPv6 (default 128).
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	// +optional
	AggregationLengthV6 *int32 `json:"aggregationLengthV6,omitempty"`
	// LocalPref is the routes' LOCAL_PREF. BGP sends it to internal peers
	// (the same AS) only: external peers never see it (RFC 4271 5.1.5).
	//
	// +optional
	LocalPref *uint32 `json:"localPref,omitempty"`
	// Communities are attached to the routes: "65000:100" (RFC 1997),
	// "large:64512:1:2" (a large community, RFC 8092), or a well-known
	// name: no-export, no-advertise, no-export-subconfed (local-as) or
	// no-peer.
	//
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=48
	// +kubebuilder:validation:items:Pattern=`^([0-9]+:[0-9]+|large:[0-9]+:[0-9]+:[0-9]+|no-export|no-advertise|no-export-subconfed|local-as|no-peer)$`
	// +listType=set
	// +optional
	Communities []string `json:"communities,omitempty"`
}

// L2Advertisement says which addresses the nodes answer ARP and NDP for,
// on which interfaces, from which nodes. A node runs the L2 responder when
// an accepted advertisement picks it; an address goes to one of the nodes
// whose advertisements pick its pool. As with BGPAdvertisement, with none
// accepted the configuration file's l2 section alone decides.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=onehop
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type L2Advertisement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   L2AdvertisementSpec `json:"spec,omitempty"`
	Status AdvertisementStatus `json:"status,omitempty"`
}

// L2AdvertisementSpec picks pools, nodes and interfaces.
type L2AdvertisementSpec struct {
	PoolSelection `json:",inline"`
	// NodeSelectors pick the nodes that answer; empty, every node.
	//
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	NodeSelectors []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
	// Interfaces answer ARP and NDP; with neither these nor
	// interfacePattern, the interface holding the node's InternalIP does.
	//
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=15
	// +kubebuilder:validation:items:Pattern=`^[^/\s]+$`
	// +listType=set
	// +optional
	Interfaces []string `json:"interfaces,omitempty"`
	// InterfacePattern is a regular expression (RE2, anchored at both
	// ends) over the node's interface names, read when the responder
	// starts: "eth[0-9]+" or "bond0\\.[0-9]+".
	//
	// +kubebuilder:validation:MaxLength=256
	// +optional
	InterfacePattern string `json:"interfacePattern,omitempty"`
}

// AdvertisementStatus says whether an advertisement is in force.
type AdvertisementStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BGPAdvertisementList is a list of BGP advertisements.
//
// +kubebuilder:object:root=true
type BGPAdvertisementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPAdvertisement `json:"items"`
}

// L2AdvertisementList is a list of L2 advertisements.
//
// +kubebuilder:object:root=true
type L2AdvertisementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []L2Advertisement `json:"items"`
}
