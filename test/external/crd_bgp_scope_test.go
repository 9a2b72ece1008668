package external

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/onehop/onehop/external/alloc"
	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

// traceRoutes makes the lab's BIRD log every route its BGP sessions
// import, withdraw or ignore as a repeat (debug routes), and print when
// sessions were established to the millisecond; it returns the log file.
func (lab *bgpLab) traceRoutes(t *testing.T) string {
	t.Helper()
	conf, log := filepath.Join(lab.dir, "bird.conf"), filepath.Join(lab.dir, "bird.log")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "error wait time 1,5;", "error wait time 1,5; debug { states, routes };", 1)
	if s == string(b) {
		t.Fatal("the lab's BIRD configuration has no template to trace routes in")
	}
	s = `log "` + log + `" all;` + "\ntimeformat protocol iso long ms;\n" + s
	if err := os.WriteFile(conf, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := lab.birdc("configure"); !strings.Contains(out, "Reconfigur") {
		t.Fatalf("birdc configure: %s", out)
	}
	return log
}

// birdLog is what BIRD logged from byte offset from on, and the offset of
// its end.
func birdLog(t *testing.T, log string, from int) (string, int) {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[min(from, len(b)):]), len(b)
}

// TestCRDBGPChangesStayInScope: two pools, each with a Service and a
// BGPAdvertisement of its own, announced by both nodes to BIRD. Changing
// pool a's advertisement (its node selector, then deleting it) and pool a
// itself (wider, with a second Service) changes pool a's routes alone: BIRD
// receives nothing for pool b's address, neither a withdrawal nor a
// repeated announcement, and neither node's session is reset.
func TestCRDBGPChangesStayInScope(t *testing.T) {
	const vipA, vipA2, vipB = vip, "203.0.113.11", "203.0.113.20"
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	log := lab.traceRoutes(t)

	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{CRDs: true})
	t.Setenv("OHX_MODEL", "1") // the agents serve what their own model programs: both Services
	sp.runAll(lab.topo, cfg)
	cr.apply(v1alpha1.LoadBalancerIPPools, "a", `{addresses: ["`+vipA+`"]}`)
	cr.apply(v1alpha1.LoadBalancerIPPools, "b", `{addresses: ["`+vipB+`"]}`)
	cr.apply(v1alpha1.BGPAdvertisements, "ad-a", `{ipAddressPools: [a]}`)
	cr.apply(v1alpha1.BGPAdvertisements, "ad-b", `{ipAddressPools: [b]}`)
	cr.apply(v1alpha1.BGPPeers, "router", `{myASN: 64513, peerASN: 64512, peerAddress: 10.0.0.1, holdTimeSeconds: 9}`)
	cr.accepted(v1alpha1.BGPPeers, "router", "True", "in force")
	cr.accepted(v1alpha1.BGPAdvertisements, "ad-a", "True", "in force")
	cr.accepted(v1alpha1.BGPAdvertisements, "ad-b", "True", "in force")

	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	eps := map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"}
	for _, s := range []struct{ name, pool, ip string }{{"web-a", "a", vipA}, {"web-b", "b", vipB}} {
		createLB(t, c, s.name, 80, annotate(alloc.AnnotationAddressPool, s.pool), local)
		if ips := lbIPs(t, c, s.name, "allocation", some); ips[0] != s.ip {
			t.Fatalf("%s got %v, want %s", s.name, ips, s.ip)
		}
		setEndpoints(t, c, s.name, eps)
		lab.waitHopsFor(t, s.ip, s.name+" announced by both nodes", "10.0.0.11", "10.0.0.12")
	}
	sessions := map[string]string{"node1": lab.established(t, "node1"), "node2": lab.established(t, "node2")}
	_, mark := birdLog(t, log, 0)

	// ad-a picks node1 alone: node2 withdraws pool a's address.
	if _, err := c.CoreV1().Nodes().Patch(context.Background(), "node1", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"rack":"a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	cr.apply(v1alpha1.BGPAdvertisements, "ad-a", `{ipAddressPools: [a], nodeSelectors: [{matchLabels: {rack: a}}]}`)
	lab.waitHopsFor(t, vipA, "ad-a picks node1 alone", "10.0.0.11")

	// Pool a grows, and a second Service takes its new address.
	cr.apply(v1alpha1.LoadBalancerIPPools, "a", `{addresses: ["`+vipA+`-`+vipA2+`"]}`)
	cr.accepted(v1alpha1.LoadBalancerIPPools, "a", "True", "in force")
	createLB(t, c, "web-a2", 80, annotate(alloc.AnnotationAddressPool, "a"), local)
	if ips := lbIPs(t, c, "web-a2", "allocation from the grown pool", some); ips[0] != vipA2 {
		t.Fatalf("web-a2 got %v, want %s", ips, vipA2)
	}
	setEndpoints(t, c, "web-a2", eps)
	lab.waitHopsFor(t, vipA2, "web-a2 announced under ad-a", "10.0.0.11")
	if hops := lab.nextHopsFor(vipA); !slices.Equal(hops, []string{"10.0.0.11"}) {
		t.Errorf("pool a's change moved %s to %v", vipA, hops)
	}

	// ad-a goes: pool a is announced no more.
	if err := cr.dyn.Resource(v1alpha1.BGPAdvertisements).Delete(context.Background(), "ad-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lab.waitHopsFor(t, vipA, "ad-a deleted")
	lab.waitHopsFor(t, vipA2, "ad-a deleted")

	lab.waitHopsFor(t, vipB, "pool b untouched", "10.0.0.11", "10.0.0.12")
	after, _ := birdLog(t, log, mark)
	for _, l := range strings.Split(after, "\n") {
		if strings.Contains(l, vipB+"/32") {
			t.Errorf("BIRD got an update for pool b's %s from a change of pool a: %s", vipB, l)
		}
	}
	if !strings.Contains(after, vipA+"/32") {
		t.Errorf("BIRD's log shows no update for pool a's %s: is it tracing routes?\n%s", vipA, after)
	}
	for n, before := range sessions {
		if now := lab.established(t, n); now != before {
			t.Errorf("%s's session was reset by pool a's changes:\nbefore %s\nafter  %s", n, before, now)
		}
	}
}
