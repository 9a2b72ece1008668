package l2

// Config is the "l2" section of the external configuration.
type Config struct {
	// Interfaces answer ARP/NDP; default: the interface holding the node's
	// InternalIP.
	Interfaces []string `json:"interfaces,omitempty"`
	// LeaseRenewSeconds (default 1) and LeaseDurationSeconds (default 3)
	// tune the per-node liveness Lease: a node whose Lease was not renewed
	// for LeaseDurationSeconds loses its IPs to the next owner.
	LeaseRenewSeconds    float64 `json:"leaseRenewSeconds,omitempty"`
	LeaseDurationSeconds float64 `json:"leaseDurationSeconds,omitempty"`
}
