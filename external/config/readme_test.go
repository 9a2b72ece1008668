package external

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// Every example of README.md with an external section decodes strictly,
// so that no example teaches a key the agent refuses.
func TestReadmeExamplesDecode(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile("(?s)```ya?ml\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if !strings.Contains(m[1], "external:") {
			continue
		}
		var doc map[string]json.RawMessage
		if err := yaml.Unmarshal([]byte(m[1]), &doc); err != nil {
			t.Errorf("example does not parse: %v\n%s", err, m[1])
			continue
		}
		if _, err := DecodeConfig(doc["external"]); err != nil {
			t.Errorf("example's external section: %v\n%s", err, m[1])
		}
		n++
	}
	if n == 0 {
		t.Fatal("README.md has no example with an external section")
	}
	t.Logf("%d examples decode", n)
}

// readmeCRDExamples are the onehop.io documents of README.md's YAML
// examples, one per document.
func readmeCRDExamples(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, m := range regexp.MustCompile("(?s)```ya?ml\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		for _, doc := range strings.Split(m[1], "\n---\n") {
			if strings.Contains(doc, "apiVersion: "+v1alpha1.GroupVersion.String()) {
				docs = append(docs, doc)
			}
		}
	}
	return docs
}

// Every custom resource example of README.md decodes strictly into its
// kind (no key the CRD lacks) and is accepted by the hook as it stands,
// with the Secrets and ConfigMap it names. test/deploy creates them on a
// real API server, whose schema and CEL rules they pass too.
func TestReadmeCRDExamples(t *testing.T) {
	var in crdObjects
	in.secrets = map[string]map[string][]byte{"bgp-auth": {"password": []byte("s3cret")}, "webhook-key": {"hmac": []byte("k3y")}}
	in.configMaps = map[string]map[string][]byte{"webhook-ca": {"ca.pem": []byte(testCA(t))}}
	kinds := map[string]int{}
	for _, doc := range readmeCRDExamples(t) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("example does not parse: %v\n%s", err, doc)
		}
		obj := in.addKind(meta.Kind)
		if obj == nil {
			t.Fatalf("example of unknown kind %q:\n%s", meta.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("%s example: %v\n%s", meta.Kind, err, doc)
		}
		kinds[meta.Kind]++
	}
	for _, k := range []string{kindPool, kindPeer, kindBGPAd, kindL2Ad, kindWebhook} {
		if kinds[k] == 0 {
			t.Errorf("README.md has no %s example", k)
		}
	}
	c, _ := convertCRDs(Config{}, in, crdMemory{})
	for _, v := range c.verdicts {
		if v.err != nil {
			t.Errorf("%s %s is not accepted: %v", v.kind, v.name, v.err)
		}
	}
	p, err := c.forNode(nil).parse()
	if err != nil {
		t.Fatalf("the examples make no configuration: %v", err)
	}
	if p.Webhook == nil || !p.webhookPools["payments"] {
		t.Errorf("the webhook example is not in force for the pool it picks: %+v, pools %v", p.Webhook, p.webhookPools)
	}
	t.Logf("examples: %v", kinds)
}

// addKind appends an empty object of one of the onehop.io kinds to in and
// returns it, to be decoded into; nil for another kind.
func (in *crdObjects) addKind(kind string) interface{ SetUID(types.UID) } {
	switch kind {
	case kindPool:
		o := &v1alpha1.LoadBalancerIPPool{}
		in.pools = append(in.pools, o)
		return o
	case kindPeer:
		o := &v1alpha1.BGPPeer{}
		in.peers = append(in.peers, o)
		return o
	case kindBGPAd:
		o := &v1alpha1.BGPAdvertisement{}
		in.bgpAds = append(in.bgpAds, o)
		return o
	case kindL2Ad:
		o := &v1alpha1.L2Advertisement{}
		in.l2Ads = append(in.l2Ads, o)
		return o
	case kindWebhook:
		o := &v1alpha1.LoadBalancerWebhook{}
		in.webhooks = append(in.webhooks, o)
		return o
	}
	return nil
}
