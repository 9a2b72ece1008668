// Package webhook is the cloud hook's provider for clouds and hardware load
// balancers without a controller of their own: it POSTs the desired state of
// each Service's external IPs to a URL, signed with HMAC-SHA256, retrying
// with exponential back-off. It knows nothing of Kubernetes.
package webhook
