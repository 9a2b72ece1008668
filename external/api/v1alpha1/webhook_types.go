package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// LoadBalancerWebhook is the receiver the cloud hook's webhook sender
// POSTs the desired state of each Service's external IPs to, signed with
// an HMAC key read from a Secret.
//
// The hook runs one webhook sender: the oldest accepted LoadBalancerWebhook
// is in force, and a newer one is Invalid. An accepted LoadBalancerWebhook
// replaces the configuration file's webhook section.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=lbwebhook,categories=onehop
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LoadBalancerWebhook struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LoadBalancerWebhookSpec   `json:"spec"`
	Status LoadBalancerWebhookStatus `json:"status,omitempty"`
}

// LoadBalancerWebhookSpec is where the state goes, how it is signed, and
// which addresses it covers.
//
// +kubebuilder:validation:XValidation:rule="url(self.url).getScheme() == 'https' || (url(self.url).getScheme() == 'http' && has(self.allowInsecureHTTP) && self.allowInsecureHTTP)",message="url must be https, or http with allowInsecureHTTP: true"
// +kubebuilder:validation:XValidation:rule="!has(self.caBundle) || !has(self.caFrom)",message="caBundle and caFrom exclude each other"
type LoadBalancerWebhookSpec struct {
	// URL receives the POSTs: https, or http with allowInsecureHTTP.
	//
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getHostname() != ''",message="must be an absolute URL with a host"
	URL string `json:"url"`

	// AllowInsecureHTTP permits an http:// URL, which sends the state and
	// its signature in clear text (for a receiver on the same host).
	//
	// +optional
	AllowInsecureHTTP bool `json:"allowInsecureHTTP,omitempty"`

	// SecretRef is the Secret, in the hook's leaseNamespace, and key
	// holding the HMAC-SHA256 key the requests are signed with. A change of
	// the Secret applies to the next request.
	SecretRef SecretKeyRef `json:"secretRef"`

	// CABundle is a PEM bundle of the CAs trusted to sign the receiver's
	// certificate instead of the system's (a private CA).
	//
	// +kubebuilder:validation:MaxLength=262144
	// +optional
	CABundle string `json:"caBundle,omitempty"`

	// CAFrom reads that bundle from a key of a Secret or ConfigMap in the
	// hook's leaseNamespace instead.
	//
	// +optional
	CAFrom *CASource `json:"caFrom,omitempty"`

	// TimeoutSeconds (default 5) bounds each request.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// MaxBackoffSeconds (default 30) caps the back-off of retries, which
	// starts at 200ms and doubles.
	//
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	MaxBackoffSeconds int32 `json:"maxBackoffSeconds,omitempty"`

	// The pools whose addresses the receiver is told about (by name or
	// label); empty, every address the hook handles, also the
	// spec.externalIPs and pod external IPs outside pools. A Service with
	// no address picked is not sent.
	PoolSelection `json:",inline"`
}

// CASource is one key of a Secret or of a ConfigMap.
//
// +kubebuilder:validation:XValidation:rule="has(self.secretKeyRef) != has(self.configMapKeyRef)",message="exactly one of secretKeyRef and configMapKeyRef"
type CASource struct {
	// +optional
	SecretKeyRef *SecretKeyRef `json:"secretKeyRef,omitempty"`
	// ConfigMapKeyRef names a ConfigMap and one of its keys.
	//
	// +optional
	ConfigMapKeyRef *SecretKeyRef `json:"configMapKeyRef,omitempty"`
}

// LoadBalancerWebhookStatus says whether the webhook is in force.
type LoadBalancerWebhookStatus struct {
	// Conditions: Accepted (True, or False with reason Invalid).
	//
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LoadBalancerWebhookList is a list of webhooks.
//
// +kubebuilder:object:root=true
type LoadBalancerWebhookList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LoadBalancerWebhook `json:"items"`
}
