package metallb

// MetalLB's Service annotations that mean what onehop's do, so that
// Services move over from MetalLB unchanged: for each, the current
// metallb.io spelling first, then the older metallb.universe.tf one.
var (
	// LoadBalancerIPsAnnotations request addresses, as
	// onehop.io/load-balancer-ips does.
	LoadBalancerIPsAnnotations = []string{"metallb.io/loadBalancerIPs", "metallb.universe.tf/loadBalancerIPs"}
	// AddressPoolAnnotations name the pool, as onehop.io/address-pool does.
	AddressPoolAnnotations = []string{"metallb.io/address-pool", "metallb.universe.tf/address-pool"}
	// AllowSharedIPAnnotations are a sharing key, as
	// onehop.io/allow-shared-ip is.
	AllowSharedIPAnnotations = []string{"metallb.io/allow-shared-ip", "metallb.universe.tf/allow-shared-ip"}
)
