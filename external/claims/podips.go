package claims

import (
	"net/netip"

	"github.com/onehop/onehop/portal"
)

// AnnotationExternalIP on a Pod gives it its own external IP.
const AnnotationExternalIP = "onehop.io/external-ip"

// PodExternalIP maps an external IP 1:1 to one pod: inbound traffic to IP is
// DNATed to PodIP (source kept), the pod's outbound traffic is SNATed to IP.
//
// A Pod claims one with the annotation onehop.io/external-ip. The claim is
// honoured only inside ExternalIPCIDRs or a pool with AllowPods, in a pool
// only when it serves the Pod's namespace and selects no Services by label
// (config.Parsed.PodIPRefused), never on a hostNetwork Pod, never on a node's
// address or a Service's IP, and only when no other Pod or Service holds
// the address (see registry). A Pod that is not running on a node with a
// pod IP of the external IP's family yet holds its claim but is not
// mapped. Terminal and deleting Pods claim nothing.
type PodExternalIP struct {
	IP       netip.Addr
	PodIP    netip.Addr
	Pod      portal.ServiceKey // the Pod's namespace/name
	NodeName string
}
