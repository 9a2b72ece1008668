// Package webhook is the cloud hook's provider for clouds and hardware load
// balancers without a controller of their own: while its agent leads, it
// POSTs over https the desired state of each Service's external IPs to a
// URL, a full Snapshot first in every leadership term, signed with
// HMAC-SHA256 over a timestamp and the body, retrying with exponential
// back-off until the state changes or the term ends. Generations grow
// across leaders from a term the caller records in the apiserver. For
// receivers it offers VerifyRequest (signature and age) and Mirror (the
// generation rules). It knows nothing of Kubernetes, and must not import
// package external or any of its other subpackages.
package webhook
