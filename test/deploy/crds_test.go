package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/test/cluster"
)

// The CRDs of deploy/base refuse what their OpenAPI and CEL rules catch,
// at create time, with the rule's message; they accept the valid objects
// and fill in the defaults.
func TestCRDValidation(t *testing.T) {
	cp, _ := cluster.StartTest(t, "crd", "192.0.2.4")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := cp.InstallCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[schema.GroupVersionResource]string{v1alpha1.LoadBalancerIPPools: "LoadBalancerIPPool", v1alpha1.BGPPeers: "BGPPeer",
		v1alpha1.L2Advertisements: "L2Advertisement", v1alpha1.LoadBalancerWebhooks: "LoadBalancerWebhook"}
	create := func(gvr schema.GroupVersionResource, doc string) (*unstructured.Unstructured, error) {
		t.Helper()
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("test object: %v\n%s", err, doc)
		}
		u.SetAPIVersion(v1alpha1.GroupVersion.String())
		u.SetKind(kinds[gvr])
		return dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
	}
	pool := v1alpha1.LoadBalancerIPPools
	peer := v1alpha1.BGPPeers
	l2 := v1alpha1.L2Advertisements
	hook := v1alpha1.LoadBalancerWebhooks
	for _, c := range []struct {
		name string
		gvr  schema.GroupVersionResource
		doc  string
		want string // part of the refusal; empty: accepted
	}{
		{"pool", pool, `{metadata: {name: ok}, spec: {addresses: ["192.0.2.0/28", "2001:db8::1-2001:db8::9", "198.51.100.7"]}}`, ""},
		{"pool of no address", pool, `{metadata: {name: none}, spec: {addresses: []}}`, "should have at least 1 items"},
		{"pool of a bad address", pool, `{metadata: {name: bad}, spec: {addresses: ["192.0.2.300"]}}`, "each address must be an IP address"},
		{"pool of a mixed range", pool, `{metadata: {name: mixed}, spec: {addresses: ["192.0.2.1-2001:db8::1"]}}`, "each address must be an IP address"},
		{"pool of a bad namespace", pool, `{metadata: {name: ns}, spec: {addresses: ["192.0.2.99"], namespaces: ["Bad_Name"]}}`, "spec.namespaces[0]"},
		{"peer", peer, `{metadata: {name: ok}, spec: {myASN: 64513, peerASN: 4200000000, peerAddress: "2001:db8::1", holdTimeSeconds: 9,
			passwordSecret: {name: bgp, key: password}, routerID: {annotation: example.net/router-id}, nextHopIPv4: {addressType: ExternalIP}}}`, ""},
		{"peer of ASN 0", peer, `{metadata: {name: asn0}, spec: {myASN: 0, peerASN: 64512, peerAddress: "10.0.0.1"}}`, "spec.myASN"},
		{"peer of a 33-bit ASN", peer, `{metadata: {name: asn33}, spec: {myASN: 64513, peerASN: 4294967296, peerAddress: "10.0.0.1"}}`, "spec.peerASN"},
		{"peer of a bad address", peer, `{metadata: {name: addr}, spec: {myASN: 64513, peerASN: 64512, peerAddress: "10.0.0"}}`, "must be an IP address"},
		{"peer with graceful restart", peer, `{metadata: {name: gr}, spec: {myASN: 64513, peerASN: 64512, peerAddress: "10.0.0.2",
			gracefulRestart: {}}}`, ""},
		{"peer of a long restart time", peer, `{metadata: {name: grlong}, spec: {myASN: 64513, peerASN: 64512, peerAddress: "10.0.0.1",
			gracefulRestart: {restartTimeSeconds: 4096}}}`, "spec.gracefulRestart.restartTimeSeconds"},
		{"peer of a short hold time", peer, `{metadata: {name: hold}, spec: {myASN: 64513, peerASN: 64512, peerAddress: "10.0.0.1", holdTimeSeconds: 2}}`, "spec.holdTimeSeconds"},
		{"peer of two router ID sources", peer, `{metadata: {name: rid}, spec: {myASN: 64513, peerASN: 64512, peerAddress: "10.0.0.1",
			routerID: {annotation: a, label: b}}}`, "exactly one of annotation, label and addressType"},
		{"iBGP peer with multihop", peer, `{metadata: {name: ibgp}, spec: {myASN: 64512, peerASN: 64512, peerAddress: "10.0.0.1", ebgpMultihop: 2}}`,
			"ebgpMultihop is for eBGP"},
		{"IPv6 next hop from a label", peer, `{metadata: {name: v6label}, spec: {myASN: 64513, peerASN: 64512, peerAddress: "10.0.0.1",
			nextHopIPv6: {label: example.net/nh6}}}`, "nextHopIPv6 cannot come from a label"},
		{"l2", l2, `{metadata: {name: ok}, spec: {ipAddressPools: [ok], interfaces: [eth0], nodeSelectors: [{matchLabels: {rack: a}}]}}`, ""},
		{"l2 of a long interface name", l2, `{metadata: {name: long}, spec: {interfaces: [averyverylongname0]}}`, "spec.interfaces[0]"},
		{"l2 of a bad interface name", l2, `{metadata: {name: slash}, spec: {interfaces: ["eth0/1"]}}`, "spec.interfaces[0]"},
		{"webhook", hook, `{metadata: {name: ok}, spec: {url: "https://lb.example.net/onehop", secretRef: {name: hook, key: hmac},
			caFrom: {configMapKeyRef: {name: ca, key: ca.pem}}, timeoutSeconds: 5, ipAddressPools: [ok]}}`, ""},
		{"webhook over http", hook, `{metadata: {name: http}, spec: {url: "http://127.0.0.1:8080/", secretRef: {name: hook, key: hmac}}}`,
			"url must be https, or http with allowInsecureHTTP: true"},
		{"webhook over http, allowed", hook, `{metadata: {name: httpok}, spec: {url: "http://127.0.0.1:8080/", allowInsecureHTTP: true,
			secretRef: {name: hook, key: hmac}}}`, ""},
		{"webhook of a relative URL", hook, `{metadata: {name: rel}, spec: {url: "/onehop", secretRef: {name: hook, key: hmac}}}`,
			"must be an absolute URL with a host"},
		{"webhook without a key", hook, `{metadata: {name: nokey}, spec: {url: "https://lb.example.net/"}}`, "spec.secretRef"},
		{"webhook of two CAs", hook, `{metadata: {name: twoca}, spec: {url: "https://lb.example.net/", secretRef: {name: hook, key: hmac},
			caBundle: "x", caFrom: {secretKeyRef: {name: ca, key: ca.pem}}}}`, "caBundle and caFrom exclude each other"},
		{"webhook of a CA from nowhere", hook, `{metadata: {name: noca}, spec: {url: "https://lb.example.net/", secretRef: {name: hook, key: hmac},
			caFrom: {}}}`, "exactly one of secretKeyRef and configMapKeyRef"},
		{"webhook of a zero timeout", hook, `{metadata: {name: t0}, spec: {url: "https://lb.example.net/", secretRef: {name: hook, key: hmac},
			timeoutSeconds: 0}}`, "spec.timeoutSeconds"},
	} {
		_, err := create(c.gvr, c.doc)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && err == nil:
			t.Errorf("%s: accepted, want refused with %q", c.name, c.want)
		case c.want != "" && !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: refused with %v, want %q", c.name, err, c.want)
		}
	}
	// The examples of external/README.md, as written.
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "external", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile("(?s)```ya?ml\n(.*?)```").FindAllStringSubmatch(string(readme), -1) {
		for _, doc := range strings.Split(m[1], "\n---\n") {
			if !strings.Contains(doc, "apiVersion: "+v1alpha1.GroupVersion.String()) {
				continue
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
				t.Fatalf("README example: %v\n%s", err, doc)
			}
			gvr := v1alpha1.GroupVersion.WithResource(strings.ToLower(u.GetKind()) + "s")
			if _, err := dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
				t.Errorf("README example %s %s refused: %v", u.GetKind(), u.GetName(), err)
			}
			n++
		}
	}
	if n < 4 {
		t.Errorf("external/README.md has %d custom resource examples, want one of each kind", n)
	}

	got, err := dyn.Resource(pool).Get(ctx, "ok", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"autoAssign", "avoidNetworkAndBroadcast"} {
		if v, ok, _ := unstructured.NestedBool(got.Object, "spec", f); !ok || !v {
			t.Errorf("pool spec.%s is %v (set: %v), want the default true", f, v, ok)
		}
	}
}
