package external

import (
	"context"
	"encoding/json"
	"math"
	"math/big"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// crdStatus is the status onehop writes to one custom resource: its
// Accepted condition and, for a pool, how many addresses are used and free.
type crdStatus struct {
	status, reason, message string
	generation              int64
	pool                    bool
	used, free              int64
}

// statusOf is the status a verdict calls for.
func statusOf(v verdict, counts map[string][2]int64) crdStatus {
	s := crdStatus{status: string(metav1.ConditionTrue), reason: v1alpha1.ReasonAccepted, message: "in force", generation: v.generation}
	if v.note != "" {
		s.message += ", " + v.note
	}
	if v.err != nil {
		s.status, s.reason, s.message = string(metav1.ConditionFalse), v1alpha1.ReasonInvalid, v.err.Error()
		if v.stale {
			s.message += "; its last accepted version stays in force"
		}
	}
	if v.kind == kindPool {
		s.pool = true
		s.used, s.free = counts[v.name][0], counts[v.name][1]
	}
	return s
}

// current reads the status u has now, as far as onehop writes it, and the
// last transition time of its Accepted condition.
func current(u *unstructured.Unstructured, pool bool) (crdStatus, string) {
	var s crdStatus
	var since string
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != v1alpha1.ConditionAccepted {
			continue
		}
		s.status, _ = m["status"].(string)
		s.reason, _ = m["reason"].(string)
		s.message, _ = m["message"].(string)
		s.generation, _, _ = unstructured.NestedInt64(m, "observedGeneration")
		since, _ = m["lastTransitionTime"].(string)
	}
	if pool {
		s.pool = true
		s.used, _, _ = unstructured.NestedInt64(u.Object, "status", "used")
		s.free, _, _ = unstructured.NestedInt64(u.Object, "status", "free")
	}
	return s, since
}

func gvrOf(kind string) schema.GroupVersionResource {
	switch kind {
	case kindPool:
		return v1alpha1.LoadBalancerIPPools
	case kindPeer:
		return v1alpha1.BGPPeers
	case kindBGPAd:
		return v1alpha1.BGPAdvertisements
	case kindWebhook:
		return v1alpha1.LoadBalancerWebhooks
	}
	return v1alpha1.L2Advertisements
}

// writeStatus brings every custom resource's status to what its last
// verdict and the allocations say. Only the holder of the allocator Lease
// calls it, so each object has one writer; per-node state (a node's
// sessions, its router ID) is never written here. It returns when to try
// again after a failed write (zero when none failed).
func (h *Hook) writeStatus(ctx context.Context) time.Time {
	h.mu.Lock()
	verdicts := h.verdicts
	h.mu.Unlock()
	if h.statusSent == nil {
		h.statusSent = map[string]crdStatus{}
	}
	counts := h.poolCounts()
	var again time.Time
	for _, v := range verdicts {
		u, ok := h.crd.object(v.kind, v.name)
		if !ok || u.GetUID() != v.uid {
			continue // gone, or replaced: the next reload has its verdict
		}
		want := statusOf(v, counts)
		key := v.kind + "/" + string(v.uid)
		have, since := current(u, want.pool)
		if have == want || h.statusSent[key] == want {
			h.statusSent[key] = want
			continue
		}
		if have.status != want.status || since == "" {
			since = metav1.Now().UTC().Format(time.RFC3339)
		}
		status := map[string]any{"conditions": []any{map[string]any{
			"type": v1alpha1.ConditionAccepted, "status": want.status, "reason": want.reason, "message": want.message,
			"observedGeneration": want.generation, "lastTransitionTime": since,
		}}}
		if want.pool {
			status["used"], status["free"] = want.used, want.free
		}
		body, err := json.Marshal(map[string]any{"status": status})
		if err == nil {
			_, err = h.dyn.Resource(gvrOf(v.kind)).Patch(ctx, v.name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
		}
		if err != nil {
			h.log.Warn("external: custom resource status not written; trying again", "kind", v.kind, "name", v.name, "err", err)
			again = earliest(again, time.Now().Add(retryFirst))
			continue
		}
		h.statusSent[key] = want
	}
	return again
}

// poolCounts are each pool's used and free addresses: used are those
// Services hold (the registry's last answer), free the rest, capped at
// the largest int64.
func (h *Hook) poolCounts() map[string][2]int64 {
	h.regMu.Lock()
	held := map[netip.Addr]bool{}
	if h.own != nil {
		for _, ips := range h.own.lb {
			for _, ip := range ips {
				held[ip] = true
			}
		}
	}
	h.regMu.Unlock()
	out := map[string][2]int64{}
	for _, p := range h.conf().pools {
		size := new(big.Int)
		for _, r := range p.Ranges {
			size.Add(size, r.Size())
		}
		var used int64
		for ip := range held {
			if p.Contains(ip) {
				used++
			}
		}
		free := size.Sub(size, big.NewInt(used))
		if !free.IsInt64() {
			free = big.NewInt(math.MaxInt64)
		}
		out[p.Name] = [2]int64{used, free.Int64()}
	}
	return out
}
