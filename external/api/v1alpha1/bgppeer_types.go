package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// BGPPeer is a router the selected nodes' BGP speakers peer with.
//
// Each node runs one speaker, with one AS number, one router ID and one
// next hop per family: myASN, routerID and the next hops must therefore be
// the same in every BGPPeer; a peer that differs from the oldest is
// Invalid, as is a newer peer with the address of an older one.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=onehop
// +kubebuilder:printcolumn:name="Peer",type=string,JSONPath=`.spec.peerAddress`
// +kubebuilder:printcolumn:name="PeerASN",type=integer,JSONPath=`.spec.peerASN`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BGPPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BGPPeerSpec   `json:"spec"`
	Status BGPPeerStatus `json:"status,omitempty"`
}

// BGPPeerSpec is one BGP neighbour and the nodes that peer with it.
//
// +kubebuilder:validation:XValidation:rule="!has(self.ebgpMultihop) || self.myASN != self.peerASN",message="ebgpMultihop is for eBGP: myASN and peerASN differ"
// +kubebuilder:validation:XValidation:rule="!has(self.nextHopIPv6) || !has(self.nextHopIPv6.label)",message="nextHopIPv6 cannot come from a label: a label value cannot hold an IPv6 address"
type BGPPeerSpec struct {
	// MyASN is the nodes' own AS number.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	MyASN int64 `json:"myASN"`

	// PeerASN is the router's AS number.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	PeerASN int64 `json:"peerASN"`

	// PeerAddress is the router's IPv4 or IPv6 address.
	//
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IP address"
	PeerAddress string `json:"peerAddress"`

	// PeerPort is the router's TCP port (default 179).
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	PeerPort int32 `json:"peerPort,omitempty"`

	// PasswordSecret enables TCP MD5 authentication (RFC 2385) with the
	// password in a Secret of the hook's leaseNamespace.
	//
	// +optional
	PasswordSecret *SecretKeyRef `json:"passwordSecret,omitempty"`

	// EBGPMultihop is the TTL of an eBGP session to a router that is not
	// directly connected; unset for a directly connected one.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	// +optional
	EBGPMultihop int32 `json:"ebgpMultihop,omitempty"`

	// HoldTimeSeconds (default 90) is the hold time offered to the router;
	// keepalives go at a third of it.
	//
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=65535
	// +optional
	HoldTimeSeconds int32 `json:"holdTimeSeconds,omitempty"`

	// BFD, when set, detects a dead link in about three intervals instead
	// of the hold time; the router must run BFD too.
	//
	// +optional
	BFD *BFD `json:"bfd,omitempty"`

	// GracefulRestart, when set, advertises BGP graceful restart (RFC
	// 4724): while a node's agent restarts, or after it died, the router
	// keeps the node's routes as stale, and forwards along them, for the
	// restart time; the node's dataplane goes on serving, and the agent
	// back announces the routes again. A stopping agent then closes the
	// session without a NOTIFICATION and withdraws nothing. The router
	// must help (BIRD and FRR do by default). A change resets the session.
	//
	// +optional
	GracefulRestart *GracefulRestart `json:"gracefulRestart,omitempty"`

	// NodeSelector picks the nodes that peer with this router; unset, every
	// node does.
	//
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// RouterID is where each node's BGP router ID comes from; unset, it is
	// the node's IPv4 next hop (an IPv6-only node needs it).
	//
	// +optional
	RouterID *NodeValue `json:"routerID,omitempty"`

	// NextHopIPv4 and NextHopIPv6 are where each node's announced next hop
	// of that family comes from; unset, the node's InternalIP of the family.
	//
	// +optional
	NextHopIPv4 *NodeValue `json:"nextHopIPv4,omitempty"`
	// +optional
	NextHopIPv6 *NodeValue `json:"nextHopIPv6,omitempty"`
}

// SecretKeyRef names one key of a Secret.
type SecretKeyRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key"`
}

// BFD tunes Bidirectional Forwarding Detection on a session.
type BFD struct {
	// IntervalMillis (default 300) is the transmit and receive interval;
	// the session is down after three missed.
	//
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=60000
	// +optional
	IntervalMillis int32 `json:"intervalMillis,omitempty"`
}

// GracefulRestart tunes BGP graceful restart on a session.
type GracefulRestart struct {
	// RestartTimeSeconds (default 120) is the restart time advertised:
	// how long the router keeps the node's routes while the session is
	// down.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4095
	// +optional
	RestartTimeSeconds int32 `json:"restartTimeSeconds,omitempty"`
}

// NodeValue is an address read from each node's own Node object: one of
// its annotations, one of its labels, or its first address of a type.
//
// +kubebuilder:validation:XValidation:rule="[has(self.annotation), has(self.label), has(self.addressType)].filter(x, x).size() == 1",message="exactly one of annotation, label and addressType"
type NodeValue struct {
	// Annotation is the key of an annotation holding the address.
	//
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Annotation string `json:"annotation,omitempty"`
	// Label is the key of a label holding the address (IPv4 only: a
	// label value cannot hold an IPv6 address).
	//
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Label string `json:"label,omitempty"`
	// AddressType takes the node's first status address of this type and
	// of the family wanted.
	//
	// +kubebuilder:validation:Enum=InternalIP;ExternalIP
	// +optional
	AddressType string `json:"addressType,omitempty"`
}

// BGPPeerStatus says whether the peer is in force. Session state is per
// node and not kept here.
type BGPPeerStatus struct {
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BGPPeerList is a list of BGP peers.
//
// +kubebuilder:object:root=true
type BGPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPPeer `json:"items"`
}
