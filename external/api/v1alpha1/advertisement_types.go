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

// BGPAdvertisementSpec picks pools and nodes.
type BGPAdvertisementSpec struct {
	PoolSelection `json:",inline"`
	// NodeSelectors pick the nodes that announce; empty, every node.
	//
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	NodeSelectors []metav1.LabelSelector `json:"nodeSelectors,omitempty"`
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
