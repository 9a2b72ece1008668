package config

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

// retryAfter is when a failed write of a status or of the published
// passwords is tried again.
const retryAfter = time.Second

// status is the status onehop writes to one custom resource: its
// Accepted condition and, for a pool, how many addresses are used and free.
type status struct {
	status, reason, message string
	generation              int64
	pool                    bool
	used, free              int64
}

// statusOf is the status a verdict calls for.
func statusOf(v Verdict, counts map[string][2]int64) status {
	s := status{status: string(metav1.ConditionTrue), reason: v1alpha1.ReasonAccepted, message: "in force", generation: v.Generation}
	if v.Note != "" {
		s.message += ", " + v.Note
	}
	if v.Err != nil {
		s.status, s.reason, s.message = string(metav1.ConditionFalse), v1alpha1.ReasonInvalid, v.Err.Error()
		if v.Stale {
			s.message += "; its last accepted version stays in force"
		}
	}
	if v.Kind == KindPool {
		s.pool = true
		s.used, s.free = counts[v.Name][0], counts[v.Name][1]
	}
	return s
}

// current reads the status u has now, as far as onehop writes it, and the
// last transition time of its Accepted condition.
func current(u *unstructured.Unstructured, pool bool) (status, string) {
	var s status
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
	case KindPool:
		return v1alpha1.LoadBalancerIPPools
	case KindPeer:
		return v1alpha1.BGPPeers
	case KindBGPAd:
		return v1alpha1.BGPAdvertisements
	case KindWebhook:
		return v1alpha1.LoadBalancerWebhooks
	}
	return v1alpha1.L2Advertisements
}

// WriteStatus brings every custom resource's status to what its last
// verdict (verdicts) and the allocations (counts: each pool's used and
// free addresses, Parsed.PoolCounts) say. Only the holder of the
// allocator Lease calls it, so each object has one writer; per-node state
// (a node's sessions, its router ID) is never written here. It returns
// when to try again after a failed write (zero when none failed).
func (w *Watch) WriteStatus(ctx context.Context, verdicts []Verdict, counts map[string][2]int64) time.Time {
	if w.statusSent == nil {
		w.statusSent = map[string]status{}
	}
	var again time.Time
	for _, v := range verdicts {
		u, ok := w.object(v.Kind, v.Name)
		if !ok || u.GetUID() != v.UID {
			continue // gone, or replaced: the next reload has its verdict
		}
		want := statusOf(v, counts)
		key := v.Kind + "/" + string(v.UID)
		have, since := current(u, want.pool)
		if have == want || w.statusSent[key] == want {
			w.statusSent[key] = want
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
			_, err = w.o.Dynamic.Resource(gvrOf(v.Kind)).Patch(ctx, v.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
		}
		if err != nil {
			w.o.Log.Warn("external: custom resource status not written; trying again", "kind", v.Kind, "name", v.Name, "err", err)
			if again.IsZero() {
				again = time.Now().Add(retryAfter)
			}
			continue
		}
		w.statusSent[key] = want
	}
	return again
}

// PoolCounts are each pool's used and free addresses: used are those of
// held (the load-balancer IPs Services hold), free the rest, capped at the
// largest int64.
func (p *Parsed) PoolCounts(held map[netip.Addr]bool) map[string][2]int64 {
	out := map[string][2]int64{}
	for _, p := range p.IPAMPools {
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
