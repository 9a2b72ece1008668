package claims_test

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/claims"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/internal/fakecluster"
	"github.com/onehop/onehop/external/internal/hooktest"
	"github.com/onehop/onehop/portal"
)

var (
	ipX = netip.MustParseAddr("192.0.2.1")
	ipE = netip.MustParseAddr("198.51.100.7")
)

func TestExternalIPOwnership(t *testing.T) {
	c := fakecluster.PoolsAndCIDRs()
	c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "10.0.0.0/8") // nodes' addresses and cluster IPs too
	w := fakecluster.NewWorld(t, c)
	first := w.Service("team-a", "first", fakecluster.ExternalIPs(ipE.String()))
	w.Service("team-a", "second", func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{ipE.String()}
		s.Spec.Ports[0].Port = 443
	})
	w.Service("team-b", "later", fakecluster.ExternalIPs(ipE.String(), "10.0.0.11", "10.96.0.1", "not-an-ip"))
	own := w.Resolve()
	if h := own.Held[ipE]; h == nil || h.Kind != claims.HeldByExternalIP || !slices.Equal(h.Services, []portal.ServiceKey{fakecluster.Key("team-a", "first"), fakecluster.Key("team-a", "second")}) {
		t.Fatalf("E held by %+v, want team-a's two Services", h)
	}
	// The node's address is served in place and announced by nobody; the
	// cluster IP of another Service and another namespace's IP are refused.
	got := fakecluster.RefusalsOf(own)["team-b/later"]
	slices.Sort(got)
	want := []string{claims.ReasonExternalIPConflict, claims.ReasonExternalIPConflict, claims.ReasonExternalIPNotAllowed}
	if !slices.Equal(got, want) {
		t.Errorf("team-b/later refusals %v, want %v", got, want)
	}
	if len(own.External[fakecluster.Key("team-b", "later")]) != 0 {
		t.Errorf("team-b/later holds %v", own.External[fakecluster.Key("team-b", "later")])
	}
	// What the dataplane must not serve: team-b's claim on E and on the
	// cluster IP, not the node's address (served in place), not the
	// address outside the CIDRs (the model refuses it itself).
	wantRefused := map[portal.ServiceKey][]netip.Addr{fakecluster.Key("team-b", "later"): {netip.MustParseAddr("10.96.0.1"), ipE}}
	if got := own.RefusedExternal(); !maps.EqualFunc(got, wantRefused, slices.Equal) {
		t.Errorf("refused external IPs %v, want %v", got, wantRefused)
	}

	// An older Service of team-b now lists E too. The controller recorded
	// E as team-a's (claims.ExternalGrantsOf, what it writes): team-a keeps E on
	// every agent, one that has run all along and one that just started.
	old := w.Service("team-b", "old", fakecluster.ExternalIPs(ipE.String()))
	old.CreationTimestamp = metav1.NewTime(first.CreationTimestamp.Add(-time.Hour))
	granted, err := claims.DecodeExternalGrants(&corev1.ConfigMap{Data: map[string]string{claims.ExternalGrantsKey: claims.ExternalGrantsOf(own)}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[netip.Addr]string{ipE: "team-a"}; !maps.Equal(granted, want) {
		t.Fatalf("grants %v, want %v", granted, want)
	}
	for i, r := range []*claims.Registry{w.Reg, claims.New(w.Cfg)} {
		own = r.Resolve(claims.Input{Services: w.Svcs, Nodes: w.Nodes, External: granted})
		if h := own.Held[ipE]; h.Namespace != "team-a" {
			t.Errorf("agent %d: an older Service edited to list E took it from its holder: %+v", i, h)
		}
		if r := fakecluster.RefusalsOf(own)["team-b/old"]; !slices.Equal(r, []string{claims.ReasonExternalIPConflict}) {
			t.Errorf("agent %d: team-b/old refusals %v", i, r)
		}
	}
	// Without a grant (no controller, or before it recorded the address)
	// the oldest claimant wins, on every agent alike: what an agent saw
	// before does not count.
	for i, r := range []*claims.Registry{w.Reg, claims.New(w.Cfg)} {
		if h := r.Resolve(claims.Input{Services: w.Svcs, Nodes: w.Nodes}).Held[ipE]; h.Namespace != "team-b" {
			t.Errorf("agent %d without grants: E held by %+v, want the oldest claimant's namespace", i, h)
		}
	}
	// The holders let go: the next claimant gets E, though the grant still
	// names team-a.
	w.Svcs = slices.DeleteFunc(w.Svcs, func(s *corev1.Service) bool { return s.Namespace == "team-a" })
	if h := w.Reg.Resolve(claims.Input{Services: w.Svcs, Nodes: w.Nodes, External: granted}).Held[ipE]; h == nil || h.Namespace != "team-b" || len(h.Services) != 2 {
		t.Errorf("after team-a let go: E held by %+v, want team-b's Services", h)
	}
	// A grant that does not parse grants nothing.
	if _, err := claims.DecodeExternalGrants(&corev1.ConfigMap{Data: map[string]string{claims.ExternalGrantsKey: "{"}}); err == nil {
		t.Error("an unreadable grant was read")
	}
}

func TestPodClaims(t *testing.T) {
	c := fakecluster.PoolsAndCIDRs()
	w := fakecluster.NewWorld(t, c)
	w.Service("team-a", "web", fakecluster.LB(ipX.String(), false))
	w.Service("team-a", "ext", fakecluster.ExternalIPs("198.51.100.8"))
	w.Service("team-c", "foreign", func(s *corev1.Service) {
		fakecluster.LB("198.51.100.9", false)(s)
		class := "example.com/other"
		s.Spec.LoadBalancerClass = &class
	})
	hostNet := func(p *corev1.Pod) { p.Spec.HostNetwork = true }
	w.Pod("team-b", "lb", ipX.String(), "node1", "10.244.1.2")              // a Service's LB IP (and not a pod pool)
	w.Pod("team-b", "ext", "198.51.100.8", "node1", "10.244.1.3")           // a Service's external IP
	w.Pod("team-b", "foreign", "198.51.100.9", "node1", "10.244.1.4")       // another controller's LB IP
	w.Pod("team-b", "cluster", "10.96.0.1", "node1", "10.244.1.5")          // a cluster IP: not allowed anyway
	w.Pod("team-b", "host", "198.51.100.20", "node1", "10.0.0.11", hostNet) // hostNetwork
	w.Pod("team-b", "ok", "192.0.2.17", "node1", "10.244.1.6")              // a pod pool
	w.Pod("team-b", "ok6", "198.51.100.21", "node2", "10.244.2.6")          // externalIPCIDRs
	own := w.Resolve()
	want := map[string][]string{
		"team-b/lb":      {claims.ReasonExternalIPNotAllowed},
		"team-b/ext":     {claims.ReasonExternalIPConflict},
		"team-b/foreign": {claims.ReasonExternalIPConflict},
		"team-b/cluster": {claims.ReasonExternalIPNotAllowed},
		"team-b/host":    {claims.ReasonExternalIPNotAllowed},
	}
	got := fakecluster.RefusalsOf(own)
	for k, r := range want {
		if !slices.Equal(got[k], r) {
			t.Errorf("%s: refusals %v, want %v", k, got[k], r)
		}
	}
	if len(got) != len(want) {
		t.Errorf("refusals %v, want %v", got, want)
	}
	var mapped []string
	for _, p := range own.Pods {
		mapped = append(mapped, p.Pod.Name+"="+p.IP.String())
	}
	if !slices.Equal(mapped, []string{"ok=192.0.2.17", "ok6=198.51.100.21"}) {
		t.Errorf("mapped %v", mapped)
	}

	// With the LB pool's addresses and the nodes' inside externalIPCIDRs,
	// a Pod still cannot take a Service's LB IP or a node's address.
	c.ExternalIPCIDRs = append(c.ExternalIPCIDRs, "192.0.2.0/28", "10.0.0.0/24")
	w2 := fakecluster.NewWorld(t, c)
	w2.Service("team-a", "web", fakecluster.LB(ipX.String(), false))
	w2.Pod("team-b", "lb", ipX.String(), "node1", "10.244.1.2")
	w2.Pod("team-b", "node", "10.0.0.12", "node1", "10.244.1.3")
	own = w2.Resolve()
	if r := fakecluster.RefusalsOf(own); !slices.Equal(r["team-b/lb"], []string{claims.ReasonExternalIPConflict}) || !slices.Equal(r["team-b/node"], []string{claims.ReasonExternalIPConflict}) {
		t.Errorf("refusals %v", r)
	}
	if len(own.Pods) != 0 {
		t.Errorf("mapped %v", own.Pods)
	}

	// A Pod holding an address keeps it when a Service lists it later,
	// and the allocator is told the address is taken.
	w3 := fakecluster.NewWorld(t, fakecluster.PoolsAndCIDRs())
	w3.Pod("team-b", "p", "198.51.100.30", "node1", "10.244.1.2")
	w3.Resolve()
	svc := w3.Service("team-a", "late", fakecluster.ExternalIPs("198.51.100.30"))
	svc.CreationTimestamp = metav1.NewTime(w3.Clock.Add(-48 * time.Hour))
	own = w3.Resolve()
	if len(own.Pods) != 1 || !slices.Equal(fakecluster.RefusalsOf(own)["team-a/late"], []string{claims.ReasonExternalIPConflict}) {
		t.Errorf("pods %v, refusals %v: the Pod should keep its address", own.Pods, fakecluster.RefusalsOf(own))
	}
	if own.Reserved(netip.MustParseAddr("198.51.100.30")) == "" || own.Reserved(netip.MustParseAddr("10.0.0.11")) == "" || own.Reserved(netip.MustParseAddr("10.96.0.1")) == "" {
		t.Error("a Pod's address, a node's or a cluster IP is not reserved for the allocator")
	}
}

func TestPodExternalIPs(t *testing.T) {
	cfg, err := config.Config{Pools: []config.PoolConfig{{Name: "pods", Addresses: []string{"192.0.2.0/28"}, AllowPods: true}, {Name: "lb", Addresses: []string{"192.0.2.16/28"}}}}.Parse()
	if err != nil {
		t.Fatal(err)
	}
	t0 := metav1.Now()
	t1 := metav1.NewTime(t0.Add(1e9))
	done := hooktest.Pod("done", "192.0.2.5", t0, "a", "10.244.0.9")
	done.Status.Phase = corev1.PodSucceeded
	own := claims.New(cfg).Resolve(claims.Input{Pods: []*corev1.Pod{
		hooktest.Pod("young", "192.0.2.1", t1, "b", "10.244.1.2"),
		hooktest.Pod("old", "192.0.2.1", t0, "a", "10.244.0.2"),
		hooktest.Pod("lbpool", "192.0.2.17", t0, "a", "10.244.0.3"),
		hooktest.Pod("bad", "nope", t0, "a", "10.244.0.4"),
		hooktest.Pod("pending", "192.0.2.2", t0, "", ""),
		hooktest.Pod("v6only", "192.0.2.3", t0, "a", "fd00::3"),
		done,
	}})
	got, refused := own.Pods, own.Refusals
	want := []claims.PodExternalIP{{IP: netip.MustParseAddr("192.0.2.1"), PodIP: netip.MustParseAddr("10.244.0.2"), Pod: portal.ServiceKey{Namespace: "ns", Name: "old"}, NodeName: "a"}}
	if !slices.Equal(got, want) {
		t.Errorf("mapped %v, want %v", got, want)
	}
	reasons := map[string]string{}
	for _, r := range refused {
		reasons[r.Obj.GetName()] = r.Reason
	}
	wantR := map[string]string{"young": "ExternalIPConflict", "lbpool": "ExternalIPNotAllowed", "bad": "BadAnnotation"}
	if len(reasons) != len(wantR) {
		t.Errorf("refusals %v, want %v", reasons, wantR)
	}
	for n, r := range wantR {
		if reasons[n] != r {
			t.Errorf("pod %s: refusal %q, want %q", n, reasons[n], r)
		}
	}
}
