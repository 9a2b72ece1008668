// Package portal is onehop's pure model: it turns Kubernetes Services,
// EndpointSlices and the local Node into desired portals — for each Service
// port and IP family, the addresses it is reached on (cluster IPs, NodePort,
// external and load-balancer IPs), the endpoints behind it and the policy
// that picks among them.
//
// It also owns the informer plumbing that feeds the model (Tracker), behind
// a small interface, so that the rest of the agent never reads Kubernetes
// objects. Nothing here touches the kernel or opens a socket.
package portal
