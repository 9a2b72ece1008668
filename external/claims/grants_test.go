package claims_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/internal/fakecluster"
)

// A node agent of a split install, which sees only its own node's Pods,
// follows the controller's grants: the controller (every Pod) grants each
// address to one Pod; node1's registry (node1's Pods and the grants) maps
// only its granted Pods, keeps other nodes' grants from any Service's
// spec.externalIPs, and maps nothing it was not granted, even a Pod that
// would win on its own view (it cannot see the older claimant on node2).
func TestNodeFollowsGrants(t *testing.T) {
	w := fakecluster.NewWorld(t, fakecluster.PoolsAndCIDRs())
	a := w.Pod("team-a", "a", "198.51.100.30", "node2", "10.244.2.2")                              // the older claim, on node2
	b := w.Pod("team-b", "b", "198.51.100.30", "node1", "10.244.1.2")                              // a younger claim of the same address, on node1
	c := w.Pod("team-b", "c", "198.51.100.31", "node1", "10.244.1.3")                              // node1's own, uncontested
	late := w.Service("team-b", "late", fakecluster.ExternalIPs("198.51.100.30", "198.51.100.31")) // and a Service listing both
	late.CreationTimestamp = metav1.NewTime(w.Clock.Add(-48 * time.Hour))                          // older than every Pod

	// The controller sees every Pod; a and c held their addresses before
	// the Service listed them, so they keep them, though it is older.
	w.Reg.Seed([]claims.Grant{{IP: netip.MustParseAddr("198.51.100.31"), Namespace: "team-b", Name: "c", UID: c.UID},
		{IP: netip.MustParseAddr("198.51.100.30"), Namespace: "team-a", Name: "a", UID: a.UID}})
	own := w.Resolve()
	gs := claims.GrantsOf(own, w.Pods)
	back, err := claims.DecodeGrants(&corev1.ConfigMap{Data: map[string]string{claims.GrantsKey: claims.EncodeGrants(gs)}})
	if err != nil {
		t.Fatal(err)
	}
	want := []claims.Grant{{IP: netip.MustParseAddr("198.51.100.30"), Namespace: "team-a", Name: "a", UID: a.UID},
		{IP: netip.MustParseAddr("198.51.100.31"), Namespace: "team-b", Name: "c", UID: c.UID}}
	if !slices.Equal(back, want) {
		t.Fatalf("grants %v, want %v", back, want)
	}

	// node1 sees b and c only. Without the grants it would map b; with
	// them it maps c, though the Service listing c's address is older.
	node1 := func(gs []claims.Grant) *claims.Ownership {
		local := []*corev1.Pod{b, c}
		return claims.New(w.Cfg).Resolve(claims.Input{Services: w.Svcs, Nodes: w.Nodes, Pods: claims.SettledPods(local, gs), Settled: true})
	}
	if got := mappedNames(claims.New(w.Cfg).Resolve(claims.Input{Nodes: w.Nodes, Pods: []*corev1.Pod{b, c}})); !slices.Contains(got, "b=198.51.100.30") {
		t.Fatalf("on its own view of the Pods node1 maps %v: the case needs b to win there", got)
	}
	o := node1(back)
	if got := mappedNames(o); !slices.Equal(got, []string{"c=198.51.100.31"}) {
		t.Errorf("node1 maps %v, want only c", got)
	}
	if h := o.Held[netip.MustParseAddr("198.51.100.30")]; h == nil || h.Kind != claims.HeldByPod || h.Pod != fakecluster.Key("team-a", "a") {
		t.Errorf("on node1 198.51.100.30 is held by %+v, want team-a/a's grant", h)
	}
	if got := o.RefusedExternal()[fakecluster.Key("team-b", "late")]; len(got) != 2 {
		t.Errorf("team-b/late keeps %v of the granted addresses on node1; want both refused", got)
	}

	// A Pod whose claim changed since its grant maps nothing until the
	// controller grants again; the old address stays held.
	moved := c.DeepCopy()
	moved.Annotations[claims.AnnotationExternalIP] = "198.51.100.40"
	o = claims.New(w.Cfg).Resolve(claims.Input{Services: w.Svcs, Nodes: w.Nodes, Pods: claims.SettledPods([]*corev1.Pod{b, moved}, back), Settled: true})
	if got := mappedNames(o); len(got) != 0 {
		t.Errorf("node1 maps %v after c's claim moved; want nothing", got)
	}
	if h := o.Held[netip.MustParseAddr("198.51.100.31")]; h == nil || h.Pod != fakecluster.Key("team-b", "c") {
		t.Errorf("198.51.100.31 held by %+v; want c's grant to hold it until the controller says", h)
	}
	// A grant names the Pod by UID: a new Pod of the same name gets nothing.
	again := c.DeepCopy()
	again.UID = "another"
	if got := mappedNames(claims.New(w.Cfg).Resolve(claims.Input{Nodes: w.Nodes, Pods: claims.SettledPods([]*corev1.Pod{again}, back), Settled: true})); len(got) != 0 {
		t.Errorf("a recreated Pod maps %v on its predecessor's grant", got)
	}

	// A controller taking over keeps the holders its predecessor granted,
	// though the other claimant is older.
	w2 := fakecluster.NewWorld(t, fakecluster.PoolsAndCIDRs())
	older := w2.Pod("team-a", "old", "198.51.100.50", "node1", "10.244.1.9")
	holder := w2.Pod("team-b", "holder", "198.51.100.50", "node2", "10.244.2.9")
	r := claims.New(w2.Cfg)
	r.Seed([]claims.Grant{{IP: netip.MustParseAddr("198.51.100.50"), Namespace: "team-b", Name: "holder", UID: holder.UID}})
	if got := mappedNames(r.Resolve(claims.Input{Nodes: w2.Nodes, Pods: []*corev1.Pod{older, holder}})); !slices.Equal(got, []string{"holder=198.51.100.50"}) {
		t.Errorf("after a change of controller %v, want the granted holder to keep its address", got)
	}
}

func mappedNames(o *claims.Ownership) []string {
	var out []string
	for _, p := range o.Pods {
		out = append(out, p.Pod.Name+"="+p.IP.String())
	}
	return out
}
