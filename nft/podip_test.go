package nft

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/portal"
)

// A pod's own external IP: inbound on any port reaches the pod with the
// client's address; the pod's own connections leave from the external IP.
func TestPodExternalIP(t *testing.T) {
	t.Parallel()
	tp := newTopo(t, 2)
	tp.client.Echo(t, "client", ":9090")
	ext := netip.MustParseAddr("203.0.113.50")
	snap := snapshot()
	snap.Node.PodExternalIPs = []portal.PodExternalIP{{External: ext, Pod: podIP(1), Name: portal.ServiceKey{Namespace: "default", Name: "singleton"}}}
	tp.sync(t, snap, true)
	for _, network := range []string{"tcp", "udp"} {
		seen, src := ask(t, tp.client, network, "203.0.113.50:8080", 3)
		if seen["pod1"] != 3 || !strings.HasPrefix(src, clientIP+":") {
			t.Errorf("%s inbound to the pod's external IP: %v, pod saw %s", network, seen, src)
		}
		_, src = ask(t, tp.pods[1], network, clientIP+":9090", 1)
		if !strings.HasPrefix(src, "203.0.113.50:") {
			t.Errorf("%s outbound from the pod: the client saw %s, want the external IP", network, src)
		}
		// Other pods and traffic inside the cluster keep their addresses.
		if _, src = ask(t, tp.pods[0], network, clientIP+":9090", 1); !strings.HasPrefix(src, podIP(0).String()) {
			t.Errorf("%s another pod's traffic was translated: %s", network, src)
		}
		if _, src = ask(t, tp.pods[1], network, podIP(0).String()+":8080", 1); !strings.HasPrefix(src, podIP(1).String()) {
			t.Errorf("%s pod-to-pod traffic was translated: %s", network, src)
		}
	}
	// The IP moves to another pod (the pod was rescheduled here).
	snap = snapshot()
	snap.Node.PodExternalIPs = []portal.PodExternalIP{{External: ext, Pod: podIP(0)}}
	tp.sync(t, snap, false)
	if seen, _ := ask(t, tp.client, "tcp", "203.0.113.50:8080", 2); seen["pod0"] != 2 {
		t.Errorf("after the move: %v", seen)
	}
	// Gone.
	tp.sync(t, snapshot(), false)
	mustDrop(t, tp.client, "tcp", "203.0.113.50:8080")
}
