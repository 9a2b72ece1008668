package config

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/api/v1alpha1"
)

// Every example of external/README.md with an external section decodes
// strictly, so that no example teaches a key the agent refuses.
func TestReadmeExamplesDecode(t *testing.T) {
	b, err := os.ReadFile("../README.md")
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
		if _, err := Decode(doc["external"]); err != nil {
			t.Errorf("example's external section: %v\n%s", err, m[1])
		}
		n++
	}
	if n == 0 {
		t.Fatal("external/README.md has no example with an external section")
	}
	t.Logf("%d examples decode", n)
}

// readmeCRDExamples are the onehop.io documents of external/README.md's
// YAML examples, one per document.
func readmeCRDExamples(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
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

// Every custom resource example of external/README.md decodes strictly
// into its kind (no key the CRD lacks) and is accepted by the hook as it
// stands, with the Secrets and ConfigMap it names. test/deploy creates them on a
// real API server, whose schema and CEL rules they pass too.
func TestReadmeCRDExamples(t *testing.T) {
	var in Objects
	in.Secrets = map[string]map[string][]byte{"bgp-auth": {"password": []byte("s3cret")}, "webhook-key": {"hmac": []byte("k3y")}}
	in.ConfigMaps = map[string]map[string][]byte{"webhook-ca": {"ca.pem": []byte(testCA(t))}}
	kinds := map[string]int{}
	for _, doc := range readmeCRDExamples(t) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("example does not parse: %v\n%s", err, doc)
		}
		obj := in.Add(meta.Kind)
		if obj == nil {
			t.Fatalf("example of unknown kind %q:\n%s", meta.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("%s example: %v\n%s", meta.Kind, err, doc)
		}
		kinds[meta.Kind]++
	}
	for _, k := range []string{KindPool, KindPeer, KindBGPAd, KindL2Ad, KindWebhook} {
		if kinds[k] == 0 {
			t.Errorf("external/README.md has no %s example", k)
		}
	}
	c, _ := Convert(Config{}, in, Memory{})
	for _, v := range c.Verdicts {
		if v.Err != nil {
			t.Errorf("%s %s is not accepted: %v", v.Kind, v.Name, v.Err)
		}
	}
	p, err := c.ForNode(nil).Parse()
	if err != nil {
		t.Fatalf("the examples make no configuration: %v", err)
	}
	if p.Webhook == nil || !p.webhookPools["payments"] {
		t.Errorf("the webhook example is not in force for the pool it picks: %+v, pools %v", p.Webhook, p.webhookPools)
	}
	t.Logf("examples: %v", kinds)
}
