package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// LoadBalancerIPPool is a set of addresses the hook hands out to
// LoadBalancer Services (and, with allowPods, to Pods), and who may have
// them.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=lbpool,categories=onehop
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Used",type=integer,JSONPath=`.status.used`
// +kubebuilder:printcolumn:name="Free",type=integer,JSONPath=`.status.free`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LoadBalancerIPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LoadBalancerIPPoolSpec   `json:"spec"`
	Status LoadBalancerIPPoolStatus `json:"status,omitempty"`
}

// LoadBalancerIPPoolSpec is a pool's addresses and tenancy.
type LoadBalancerIPPoolSpec struct {
	// Addresses are CIDRs ("192.0.2.0/24"), ranges of two addresses
	// ("192.0.2.10-192.0.2.20") or single addresses, IPv4 and IPv6. Pools
	// must not overlap: of two that do, the newer is Invalid.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=90
	// +kubebuilder:validation:XValidation:rule="self.all(a, isIP(a) || isCIDR(a) || (a.split('-').size() == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()))",message="each address must be an IP address, a CIDR or a range first-last of one family"
	// +listType=set
	Addresses []string `json:"addresses"`

	// AvoidNetworkAndBroadcast (default true) keeps the network and
	// broadcast addresses of IPv4 CIDRs of /30 and larger, and the first
	// (Subnet-Router anycast) address of IPv6 CIDRs of /126 and larger, out
	// of the pool. Set it to false for a block routed as a whole. Ranges
	// and single addresses are always taken as written.
	//
	// +kubebuilder:default=true
	// +optional
	AvoidNetworkAndBroadcast *bool `json:"avoidNetworkAndBroadcast,omitempty"`

	// AutoAssign (default true) lets Services that name no pool get
	// addresses from it. A pool with allowPods is never auto-assigned.
	//
	// +kubebuilder:default=true
	// +optional
	AutoAssign *bool `json:"autoAssign,omitempty"`

	// AllowPods lets Pods claim its addresses with onehop.io/external-ip.
	//
	// +optional
	AllowPods bool `json:"allowPods,omitempty"`

	// Namespaces, when set, are the only namespaces whose Services may use
	// the pool, however they ask: auto-assignment, onehop.io/address-pool
	// or a requested address.
	//
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`

	// ServiceSelectors, when set, admit only the Services whose labels
	// match one of them.
	//
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	ServiceSelectors []metav1.LabelSelector `json:"serviceSelectors,omitempty"`

	// Priority orders auto-assignment among the pools that serve a
	// Service: lower first; pools without one come last, oldest first.
	//
	// +optional
	Priority *int32 `json:"priority,omitempty"`

	// ShareAcrossNamespaces lets one onehop.io/allow-shared-ip key join
	// Services of different namespaces on one address; by default a key
	// joins only Services of one namespace.
	//
	// +optional
	ShareAcrossNamespaces bool `json:"shareAcrossNamespaces,omitempty"`
}

// LoadBalancerIPPoolStatus says whether the pool is in force and how full
// it is.
type LoadBalancerIPPoolStatus struct {
	// Conditions: Accepted (True, or False with reason Invalid).
	//
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Used is how many of the pool's addresses Services hold.
	//
	// +optional
	Used int64 `json:"used"`
	// Free is how many are left to hand out (capped at 2^63-1, which a
	// large IPv6 pool exceeds).
	//
	// +optional
	Free int64 `json:"free"`
}

// LoadBalancerIPPoolList is a list of pools.
//
// +kubebuilder:object:root=true
type LoadBalancerIPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LoadBalancerIPPool `json:"items"`
}
