package external

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// resolve runs the registry over the informers' current state and keeps
// the answer for the allocator (Reserved) and PodExternalIPs.
func (h *Hook) resolve() (*ownership, registryInput) {
	var in registryInput
	for _, o := range h.services.GetStore().List() {
		in.services = append(in.services, o.(*corev1.Service))
	}
	for _, o := range h.nodes.GetStore().List() {
		in.nodes = append(in.nodes, o.(*corev1.Node))
	}
	if h.pods != nil {
		for _, o := range h.pods.GetStore().List() {
			in.pods = append(in.pods, o.(*corev1.Pod))
		}
	}
	if h.grants != nil && h.pods != nil {
		in.pods, in.settled = settledPods(in.pods, h.currentGrants()), true
	}
	synced := h.Synced()
	h.regMu.Lock()
	in.external = h.externalGrants()
	own := h.registry.resolve(in)
	h.own = own
	h.noteRefused(own, synced)
	released := false
	for ip := range h.reservedIPs {
		if own.reserved(ip) == "" {
			released = true
		}
	}
	h.reservedIPs = map[netip.Addr]bool{}
	for ip := range own.held {
		if own.reserved(ip) != "" {
			h.reservedIPs[ip] = true
		}
	}
	h.regMu.Unlock()
	if released {
		h.mu.Lock()
		a := h.alloc
		h.mu.Unlock()
		if a != nil {
			a.retryWaiting()
		}
	}
	return own, in
}

// reserved is the allocator's view of addresses held by others than
// load-balancer allocations (the registry's last answer).
func (h *Hook) reserved(ip netip.Addr) string {
	h.regMu.Lock()
	defer h.regMu.Unlock()
	return h.own.reserved(ip)
}

// state is what the providers are told now.
func (h *Hook) state() *State {
	own, rin := h.resolve()
	in := targetInput{services: rin.services, nodes: rin.nodes, own: own}
	for _, o := range h.slices.GetStore().List() {
		in.slices = append(in.slices, o.(*discoveryv1.EndpointSlice))
	}
	h.mu.Lock()
	leader := h.leader
	prog, podIPs := h.programmed, h.podProgrammed
	h.mu.Unlock()
	if leader {
		h.report(own.refusals)
	}
	tgs, cluster := targetsAndCluster(in)
	st := &State{Node: h.node, Leader: leader, Targets: tgs, NodeAddresses: map[string][]netip.Addr{},
		programmed: prog, podIPs: podIPs, cluster: cluster}
	st.indexTargets()
	for _, n := range in.nodes {
		st.NodeAddresses[n.Name] = h.nodeAddrs(n.Name)
	}
	if h.liveness != nil {
		st.alive = h.liveness.alive
	}
	conf := h.conf()
	st.ann = conf.announcer(h.nodeLabels)
	if st.ann != nil {
		st.ann.kept = conf.keptPools(in.services)
	}
	return st
}
