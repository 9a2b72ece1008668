package external

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/test/cluster"
)

// TestNodeAgentReadsOnlyBGPPasswords: a split install as deploy/ ships it,
// upgraded with a BGPPeer whose password is in a Secret of the lease
// namespace, beside other Secrets there (a webhook's key) and in other
// namespaces. Both nodes' agents, each with its pod's token under
// deploy/base's RBAC, peer with BIRD, which requires the password: they
// read it from the one Secret the controller publishes the BGP passwords
// in. With that same token, every get, list and watch of any other Secret,
// in the lease namespace or elsewhere, is Forbidden, and so is a write of
// the published one; the published Secret holds the peer's password and
// nothing else.
func TestNodeAgentReadsOnlyBGPPasswords(t *testing.T) {
	lab := newBGPLab(t)
	cp, c := lab.twoNodeCluster("router")
	lab.requirePassword(t, "s3cret")
	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	cfg := sp.config(config.Config{CRDs: true})

	// What was there before: the password Secret and its peer, and
	// Secrets no node needs.
	setSecret(t, c, "bgp-auth", "password", "s3cret")
	setSecret(t, c, "webhook-key", "hmac", "not-for-nodes")
	ctx := context.Background()
	for _, ns := range []string{"kube-system", "default"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "elsewhere"}, Data: map[string][]byte{"k": []byte("v")}}
		if _, err := c.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cr.apply(v1alpha1.BGPPeers, "router", `{myASN: 64513, peerASN: 64512, peerAddress: 10.0.0.1, holdTimeSeconds: 9,
		passwordSecret: {name: bgp-auth, key: password}}`)

	sp.runAll(lab.topo, cfg)
	cr.accepted(v1alpha1.BGPPeers, "router", "True", "in force")
	// BIRD establishes no session without the password.
	for _, n := range []string{"node1", "node2"} {
		t.Logf("BIRD's session with %s: %s", n, lab.established(t, n))
	}

	// node1's agent's own token, as the kubelet gives it to its pod.
	id, err := cp.PodIdentity(ctx, cluster.AgentNamespace, cluster.NodeAgentServiceAccount, "onehop-node1", "node1")
	if err != nil {
		t.Fatal(err)
	}
	node, err := kubernetes.NewForConfig(id.Config)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("node agent %s: got %v, want Forbidden", what, err)
		}
	}
	named := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	}
	for _, s := range []struct{ ns, name string }{
		{splitLeaseNamespace, "bgp-auth"}, {splitLeaseNamespace, "webhook-key"},
		{"kube-system", "elsewhere"}, {"default", "elsewhere"},
	} {
		secrets := node.CoreV1().Secrets(s.ns)
		_, err := secrets.Get(ctx, s.name, metav1.GetOptions{})
		forbidden("getting "+s.ns+"/"+s.name, err)
		_, err = secrets.List(ctx, named(s.name))
		forbidden("listing "+s.ns+"/"+s.name, err)
		w, err := secrets.Watch(ctx, named(s.name))
		if w != nil {
			w.Stop()
		}
		forbidden("watching "+s.ns+"/"+s.name, err)
	}
	for _, ns := range []string{splitLeaseNamespace, "kube-system", "default", ""} {
		_, err := node.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		forbidden("listing every Secret of namespace "+ns, err)
		w, err := node.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{})
		if w != nil {
			w.Stop()
		}
		forbidden("watching every Secret of namespace "+ns, err)
	}
	_, err = node.CoreV1().Secrets(splitLeaseNamespace).Create(ctx,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{})
	forbidden("creating a Secret", err)

	// The published passwords: readable (get, and list and watch by
	// name), not writable, and holding the peer's password alone.
	published := node.CoreV1().Secrets(splitLeaseNamespace)
	pub, err := published.Get(ctx, config.BGPPasswordsSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node agent getting the published BGP passwords: %v", err)
	}
	if _, err := published.List(ctx, named(config.BGPPasswordsSecretName)); err != nil {
		t.Errorf("node agent listing the published BGP passwords by name: %v", err)
	}
	if w, err := published.Watch(ctx, named(config.BGPPasswordsSecretName)); err != nil {
		t.Errorf("node agent watching the published BGP passwords by name: %v", err)
	} else {
		w.Stop()
	}
	var got map[string]map[string][]byte
	if err := json.Unmarshal(pub.Data[config.BGPPasswordsKey], &got); err != nil {
		t.Fatalf("published BGP passwords %q: %v", pub.Data, err)
	}
	if len(got) != 1 || len(got["bgp-auth"]) != 1 || string(got["bgp-auth"]["password"]) != "s3cret" {
		t.Errorf("published BGP passwords: %q, want bgp-auth's password alone", got)
	}
	pub.Data = map[string][]byte{config.BGPPasswordsKey: []byte(`{"bgp-auth":{"password":"b3duZWQ="}}`)}
	_, err = published.Update(ctx, pub, metav1.UpdateOptions{})
	forbidden("updating the published BGP passwords", err)
}
