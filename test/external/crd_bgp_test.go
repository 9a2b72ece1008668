package external

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

// requirePassword makes the lab's BIRD ask every node for the TCP MD5
// password pw and print when sessions were established to the
// millisecond, and reloads it.
func (lab *bgpLab) requirePassword(t *testing.T, pw string) {
	t.Helper()
	conf := filepath.Join(lab.dir, "bird.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "error wait time 1,5;", `error wait time 1,5; password "`+pw+`";`, 1)
	if s == string(b) {
		t.Fatal("the lab's BIRD configuration has no template to add a password to")
	}
	if err := os.WriteFile(conf, []byte("timeformat protocol iso long ms;\n"+s), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := lab.birdc("configure"); !strings.Contains(out, "Reconfigur") {
		t.Fatalf("birdc configure: %s", out)
	}
}

// startSecondRouter runs a second BIRD, at secondRouter on the nodes'
// bridge, that peers with node1 alone (password pw) and imports nothing;
// it returns its session line with node1 once established.
func (lab *bgpLab) startSecondRouter(t *testing.T, pw string) (established func() string) {
	t.Helper()
	conf, ctl := lab.addSecondRouter()
	if err := os.WriteFile(conf, []byte(`router id `+secondRouter+`;
protocol device { scan time 10; }
protocol bgp node1 { local `+secondRouter+` as 64512; neighbor 10.0.0.11 as 64513; passive yes;
  hold time 9; keepalive time 3; connect retry time 1; error wait time 1,5; password "`+pw+`";
  ipv4 { import none; export none; }; }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	lab.runBird("router2", conf, ctl, "second bird")
	return func() string {
		t.Helper()
		var line string
		if _, ok := waitFor(context.Background(), 30*time.Second, func() bool {
			out, _ := lab.command("router2", "birdc", "-s", ctl, "show", "protocols").CombinedOutput()
			line = regexp.MustCompile(`(?m)^node1\s.*$`).FindString(string(out))
			return strings.Contains(line, "Established")
		}); !ok {
			t.Fatalf("the second router's session with node1 is not established: %q", line)
		}
		return line
	}
}

// secondRouter is the address of the lab's second BIRD.
const secondRouter = "10.0.0.3"

// established is BIRD's line for the session with node (its state and
// since when), once it is established and has stayed the same for a
// second: BIRD moves the time on by a millisecond or so as the session
// settles after it shows Established, which is no reset.
func (lab *bgpLab) established(t *testing.T, node string) string {
	t.Helper()
	var line, last string
	re := regexp.MustCompile(`(?m)^` + node + `\s.*$`)
	_, ok := waitFor(context.Background(), 30*time.Second, func() bool {
		line = re.FindString(lab.birdc("show", "protocols"))
		if !strings.Contains(line, "Established") || line != last {
			last = line
			time.Sleep(time.Second)
			return false
		}
		return true
	})
	if !ok {
		t.Fatalf("BIRD's session with %s is not established and settled: %q", node, line)
	}
	return line
}

func setSecret(t *testing.T, c kubernetes.Interface, name, key, value string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: splitLeaseNamespace, Name: name}, Data: map[string][]byte{key: []byte(value)}}
	_, err := c.CoreV1().Secrets(splitLeaseNamespace).Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		_, err = c.CoreV1().Secrets(splitLeaseNamespace).Create(context.Background(), s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestCRDBGPPeerFromSecret: a split install as deploy/ ships it, with crds
// on and nothing but that in the file. A LoadBalancerIPPool and a BGPPeer
// whose password is in a Secret make both nodes announce the Service's
// address to BIRD, which requires that password; each node's session is a
// BGPSessionEstablished event on its Node and onehop_bgp_session_up on
// its agent's metrics. A newer peer of another
// ASN is Invalid and changes nothing; a second peer joins node1's speaker
// without resetting its first session; a wrong password in the Secret
// takes the sessions down (one BGPSessionDown event, however often the
// session is tried) and the right one brings them back, without a
// restart; a nodeSelector that leaves node2 out withdraws node2 alone, and
// node1's session is not reset; once no peer picks node2, the Service gets
// an IPMoved event for its next hops.
func TestCRDBGPPeerFromSecret(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	lab.requirePassword(t, "s3cret")
	secondEstablished := lab.startSecondRouter(t, "s3cret")

	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{CRDs: true})
	sp.runAll(lab.topo, cfg)
	setSecret(t, c, "bgp-auth", "password", "s3cret")
	cr.apply(v1alpha1.LoadBalancerIPPools, "lab", `{addresses: ["`+vip+`"]}`)
	peer := `{myASN: 64513, peerASN: 64512, peerAddress: 10.0.0.1, holdTimeSeconds: 9, passwordSecret: {name: bgp-auth, key: password}}`
	cr.apply(v1alpha1.BGPPeers, "router", peer)
	cr.accepted(v1alpha1.BGPPeers, "router", "True", "in force")

	createLB(t, c, "web", 80, func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal })
	if ips := lbIPs(t, c, "web", "allocation", some); ips[0] != vip {
		t.Fatalf("web got %v, want %s", ips, vip)
	}
	setEndpoints(t, c, "web", map[string]string{"node1": "10.244.1.2", "node2": "10.244.2.2"})
	lab.waitHops(t, "both nodes peer with the Secret's password", "10.0.0.11", "10.0.0.12")
	// Each node's session state is an event on its own Node.
	if msg := eventIn(t, c, "default", "node1", "BGPSessionEstablished"); !strings.Contains(msg, "10.0.0.1 (AS 64512)") {
		t.Fatalf("BGPSessionEstablished on node1: %q; want the peer named", msg)
	}
	// And a metric on its agent, as is what it announces.
	for _, n := range []string{"node1", "node2"} {
		sp.waitNodeMetric(t, n, `onehop_bgp_session_up{peer="10.0.0.1"}`, "1")
		sp.waitNodeMetric(t, n, `onehop_announced_ips{provider="bgp"}`, "1")
		sp.waitNodeMetric(t, n, `onehop_bgp_announced_prefixes_total{peer="10.0.0.1"}`, "1")
	}
	if got, err := lab.get("client", vip+":80"); err != nil || !strings.HasPrefix(got, "pod") {
		t.Fatalf("client -> %s: %q, %v", vip, got, err)
	}

	// A second peer joins node1's running speaker: its session with the
	// first router is not reset.
	before := lab.established(t, "node1")
	cr.apply(v1alpha1.BGPPeers, "second", `{myASN: 64513, peerASN: 64512, peerAddress: `+secondRouter+`, holdTimeSeconds: 9,
		passwordSecret: {name: bgp-auth, key: password}}`)
	cr.accepted(v1alpha1.BGPPeers, "second", "True", "in force")
	secondEstablished()
	sp.waitNodeMetric(t, "node1", `onehop_bgp_session_up{peer="`+secondRouter+`"}`, "1")
	sp.waitNodeMetric(t, "node1", `onehop_bgp_announced_prefixes_total{peer="`+secondRouter+`"}`, "1")
	// The second router peers with node1 alone: node2's session with it
	// is down, and carries nothing.
	sp.waitNodeMetric(t, "node2", `onehop_bgp_session_up{peer="`+secondRouter+`"}`, "0")
	sp.waitNodeMetric(t, "node2", `onehop_bgp_announced_prefixes_total{peer="`+secondRouter+`"}`, "0")
	if after := lab.established(t, "node1"); after != before {
		t.Errorf("adding a peer reset node1's session with the first:\nbefore %s\nafter  %s", before, after)
	}

	cr.apply(v1alpha1.BGPPeers, "other", `{myASN: 64999, peerASN: 64512, peerAddress: 10.0.0.4}`)
	cr.accepted(v1alpha1.BGPPeers, "other", "False", "myASN 64999 differs from BGPPeer router's 64513")
	cr.accepted(v1alpha1.BGPPeers, "router", "True", "in force")

	setSecret(t, c, "bgp-auth", "password", "wrong")
	lab.waitHops(t, "the Secret's password is wrong")
	eventIn(t, c, "default", "node2", "BGPSessionDown")
	sp.waitNodeMetric(t, "node2", `onehop_bgp_session_up{peer="10.0.0.1"}`, "0")
	sp.waitNodeMetric(t, "node2", `onehop_bgp_announced_prefixes_total{peer="10.0.0.1"}`, "0")
	setSecret(t, c, "bgp-auth", "password", "s3cret")
	lab.waitHops(t, "the Secret's password is right again", "10.0.0.11", "10.0.0.12")
	// The attempts with the wrong password were one session down, not
	// an event each.
	if n := nodeEvents(t, c, "node2", "BGPSessionDown"); n != 1 {
		t.Errorf("%d BGPSessionDown events on node2 for one wrong password, want 1", n)
	}

	before = lab.established(t, "node1")
	if _, err := c.CoreV1().Nodes().Patch(context.Background(), "node1", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"rack":"a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	cr.apply(v1alpha1.BGPPeers, "router", strings.TrimSuffix(peer, "}")+`, nodeSelector: {matchLabels: {rack: a}}}`)
	lab.waitHops(t, "node2 is no longer picked", "10.0.0.11")
	sp.waitNodeMetric(t, "node2", `onehop_bgp_session_up{peer="10.0.0.1"}`, "") // not its peer any more
	sp.waitNodeMetric(t, "node1", `onehop_bgp_session_up{peer="10.0.0.1"}`, "1")
	if after := lab.established(t, "node1"); after != before {
		t.Errorf("node1's session was reset although its peers did not change:\nbefore %s\nafter  %s", before, after)
	}

	// With the second peer limited to rack a too, node2 has no peer left
	// and announces nothing: the controller tells the Local-policy
	// Service its next hops changed.
	cr.apply(v1alpha1.BGPPeers, "second", `{myASN: 64513, peerASN: 64512, peerAddress: `+secondRouter+`, holdTimeSeconds: 9,
		passwordSecret: {name: bgp-auth, key: password}, nodeSelector: {matchLabels: {rack: a}}}`)
	eventSaying(t, c, "default", "web", "IPMoved", vip+": BGP next hops now node1, were node1, node2")
	sp.waitNodeMetric(t, "node2", `onehop_bgp_session_up{peer="`+secondRouter+`"}`, "")
}
