package config

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// The controller publishes the keys the BGPPeers name and nothing else of
// the lease namespace's Secrets: not another key of the same Secret, not a
// Secret no peer names, not the webhook's key even when a peer names it
// (that peer is Invalid). A node agent that resolves the peers from the
// published passwords alone gets the controller's peers and verdicts.
func TestPublishedPasswords(t *testing.T) {
	tor := testPeer("tor", 1, 64513, "10.0.0.1")
	tor.Spec.PasswordSecret = &v1alpha1.SecretKeyRef{Name: "bgp", Key: "password"}
	leak := testPeer("leak", 2, 64513, "10.0.0.2")
	leak.Spec.PasswordSecret = &v1alpha1.SecretKeyRef{Name: "hook", Key: "hmac"}
	missing := testPeer("missing", 3, 64513, "10.0.0.3")
	missing.Spec.PasswordSecret = &v1alpha1.SecretKeyRef{Name: "bgp", Key: "other-tenant"}
	wh := testWebhook("lb", 1, "https://lb.example.net/onehop")
	ctl := Objects{
		Peers:    []*v1alpha1.BGPPeer{tor, leak, missing, testPeer("plain", 4, 64513, "10.0.0.4")},
		Webhooks: []*v1alpha1.LoadBalancerWebhook{wh},
		Secrets: map[string]map[string][]byte{
			"bgp":     {"password": []byte("s3cret"), "unnamed": []byte("x")},
			"hook":    {"hmac": []byte("k3y")},
			"someone": {"password": []byte("theirs")},
		},
	}
	c, _ := Convert(Config{}, ctl, Memory{})
	want := map[string]map[string][]byte{"bgp": {"password": []byte("s3cret")}}
	if !reflect.DeepEqual(c.passwords, want) {
		t.Fatalf("published %q, want %q", c.passwords, want)
	}
	wantInvalid(t, c, KindPeer, "leak", `key "hmac" of Secret "hook" is read by LoadBalancerWebhook lb`)
	wantInvalid(t, c, KindPeer, "missing", `Secret "bgp" has no key "other-tenant"`)

	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: BGPPasswordsSecretName}, Data: map[string][]byte{BGPPasswordsKey: encodePasswords(c.passwords)}}
	got, err := decodePasswords(s)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %q, %v; want %q", got, err, want)
	}
	node := ctl
	node.Webhooks, node.Secrets = nil, got
	n, _ := Convert(Config{}, node, Memory{})
	if a, b := c.ForNode(nil).BGP, n.ForNode(nil).BGP; !reflect.DeepEqual(a, b) {
		t.Errorf("node agent's peers %+v, controller's %+v", b, a)
	}
	for _, name := range []string{"tor", "plain"} {
		if v := verdictOf(t, n, KindPeer, name); v.Err != nil {
			t.Errorf("node agent: %s %v", name, v.Err)
		}
	}

	// Unreadable published data is no password at all, not a crash.
	s.Data[BGPPasswordsKey] = []byte("{")
	if got, err := decodePasswords(s); err == nil || len(got) != 0 {
		t.Errorf("bad published data: %q, %v; want an error and nothing", got, err)
	}
}
