package ipvs

import "testing"

// TestHairpinThroughTheModel: a pod reaching itself through its Service
// (Cluster policy, the only endpoint, on this node) is answered, and sees
// the node as source. The model lists such endpoints in Portal.Hairpin;
// LocalEndpoints it fills under a Local policy only.
func TestHairpinThroughTheModel(t *testing.T) {
	n := newTestNet(t, 1)
	const cip = "10.96.6.10"
	a := n.startAgent(service("self", cip, nil), slice("self", 1))
	a.waitSynced()
	c, err := n.dial(n.pods[0], cip+":80")
	if err != nil {
		t.Fatalf("pod-1 to its own Service: %v", err)
	}
	c.Close()
	if c.Pod != "pod-1" || c.Source == podIP(1) {
		t.Errorf("hairpin: reached %s seeing %s, want pod-1 seeing the node", c.Pod, c.Source)
	}
}
