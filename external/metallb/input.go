package metallb

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MetalLB's custom resources, as far as Convert reads them: the
// fields of metallb.io/v1beta1 IPAddressPool, L2Advertisement,
// BGPAdvertisement and BFDProfile and of v1beta2 (or v1beta1) BGPPeer.

type mlbObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   mlbMeta           `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
	Items      []json.RawMessage `json:"items"` // kind List, as kubectl get -o yaml prints
}

type mlbMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

type mlbPool struct {
	Addresses         []string `json:"addresses"`
	AutoAssign        *bool    `json:"autoAssign"`
	AvoidBuggyIPs     bool     `json:"avoidBuggyIPs"`
	ServiceAllocation *struct {
		Priority           *int32                 `json:"priority"`
		Namespaces         []string               `json:"namespaces"`
		NamespaceSelectors []metav1.LabelSelector `json:"namespaceSelectors"`
		ServiceSelectors   []metav1.LabelSelector `json:"serviceSelectors"`
	} `json:"serviceAllocation"`
}

type mlbPoolSelection struct {
	IPAddressPools         []string               `json:"ipAddressPools"`
	IPAddressPoolSelectors []metav1.LabelSelector `json:"ipAddressPoolSelectors"`
	NodeSelectors          []metav1.LabelSelector `json:"nodeSelectors"`
}

type mlbL2Ad struct {
	mlbPoolSelection
	Interfaces []string `json:"interfaces"`
}

type mlbBGPAd struct {
	mlbPoolSelection
	AggregationLength   *int32   `json:"aggregationLength"`
	AggregationLengthV6 *int32   `json:"aggregationLengthV6"`
	LocalPref           *uint32  `json:"localPref"`
	Communities         []string `json:"communities"`
	Peers               []string `json:"peers"`
}

type mlbPeer struct {
	MyASN          int64                  `json:"myASN"`
	PeerASN        int64                  `json:"peerASN"`
	DynamicASN     string                 `json:"dynamicASN"`
	PeerAddress    string                 `json:"peerAddress"`
	SourceAddress  string                 `json:"sourceAddress"`
	Interface      string                 `json:"interface"`
	PeerPort       int32                  `json:"peerPort"`
	HoldTime       *metav1.Duration       `json:"holdTime"`
	KeepaliveTime  *metav1.Duration       `json:"keepaliveTime"`
	ConnectTime    *metav1.Duration       `json:"connectTime"`
	RouterID       string                 `json:"routerID"`
	NodeSelectors  []metav1.LabelSelector `json:"nodeSelectors"`
	Password       string                 `json:"password"`
	PasswordSecret *struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"passwordSecret"`
	BFDProfile            string `json:"bfdProfile"`
	EnableGracefulRestart bool   `json:"enableGracefulRestart"`
	EBGPMultiHop          bool   `json:"ebgpMultiHop"`
	VRFName               string `json:"vrf"`
	DisableMP             bool   `json:"disableMP"`
}

type mlbBFDProfile struct {
	ReceiveInterval  *int32 `json:"receiveInterval"`
	TransmitInterval *int32 `json:"transmitInterval"`
	DetectMultiplier *int32 `json:"detectMultiplier"`
	EchoInterval     *int32 `json:"echoInterval"`
	EchoMode         bool   `json:"echoMode"`
	PassiveMode      bool   `json:"passiveMode"`
	MinimumTTL       *int32 `json:"minimumTtl"`
}
