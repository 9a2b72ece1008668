package external

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/webhook"
	"github.com/onehop/onehop/portal"
)

func testWebhook(name string, age int, url string) *v1alpha1.LoadBalancerWebhook {
	return &v1alpha1.LoadBalancerWebhook{ObjectMeta: meta(name, age), Spec: v1alpha1.LoadBalancerWebhookSpec{
		URL: url, SecretRef: v1alpha1.SecretKeyRef{Name: "hook", Key: "hmac"}}}
}

// testCA is a PEM certificate, as a receiver's private CA would be.
func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// A LoadBalancerWebhook becomes the sender's configuration with its key
// read from the Secret (trimmed, as a key file is) and its CA from a
// ConfigMap; it replaces the file's webhook section, and says so.
func TestConvertWebhook(t *testing.T) {
	ca := testCA(t)
	o := testWebhook("lb", 1, "https://lb.example.net/onehop")
	o.Spec.CAFrom = &v1alpha1.CASource{ConfigMapKeyRef: &v1alpha1.SecretKeyRef{Name: "ca", Key: "ca.pem"}}
	o.Spec.TimeoutSeconds, o.Spec.MaxBackoffSeconds = 3, 7
	in := crdObjects{webhooks: []*v1alpha1.LoadBalancerWebhook{o},
		secrets:    map[string]map[string][]byte{"hook": {"hmac": []byte("k3y\n")}},
		configMaps: map[string]map[string][]byte{"ca": {"ca.pem": []byte(ca)}}}
	base := Config{Webhook: &webhook.Config{URL: "https://file.example.net/", SecretFile: "/etc/onehop/key"}}
	c, mem := convertCRDs(base, in, crdMemory{})
	want := webhook.Config{URL: "https://lb.example.net/onehop", Secret: "k3y", CA: []byte(ca), TimeoutSeconds: 3, MaxBackoffSeconds: 7}
	if c.cfg.Webhook == nil || !reflect.DeepEqual(*c.cfg.Webhook, want) {
		t.Fatalf("webhook %+v, want %+v", c.cfg.Webhook, want)
	}
	if c.cfg.webhookPools != nil {
		t.Errorf("no pool selection picks pools %v, want every address", c.cfg.webhookPools)
	}
	v := verdictOf(t, c, kindWebhook, "lb")
	if s := statusOf(v, nil); v.err != nil || !strings.Contains(s.message, "in place of the configuration file's webhook section") {
		t.Errorf("verdict %v, status %q: want accepted, saying it replaces the file's", v.err, s.message)
	}
	if got := c.webhookSource(base); !strings.Contains(got, "LoadBalancerWebhook lb") {
		t.Errorf("source %q", got)
	}
	if _, ok := mem.webhooks[o.UID]; !ok {
		t.Error("the accepted webhook is not remembered")
	}
	// Without one, the file's section stays.
	c, _ = convertCRDs(base, crdObjects{}, crdMemory{})
	if c.cfg.Webhook != base.Webhook || c.webhookSource(base) != "the configuration file" {
		t.Errorf("no LoadBalancerWebhook: webhook %+v from %q, want the file's", c.cfg.Webhook, c.webhookSource(base))
	}
}

// What the schema cannot see is refused with a reason: a missing Secret or
// key, a CA bundle that holds no certificate, a plain http URL (when the
// schema was bypassed), a bad pool selector, and a second webhook.
func TestConvertWebhookInvalid(t *testing.T) {
	secrets := map[string]map[string][]byte{"hook": {"hmac": []byte("k3y")}, "empty": {"hmac": nil}}
	for _, c := range []struct {
		name string
		mod  func(*v1alpha1.LoadBalancerWebhook)
		want string
	}{
		{"no Secret", func(o *v1alpha1.LoadBalancerWebhook) { o.Spec.SecretRef.Name = "nope" }, `secretRef: no Secret "nope" in the lease namespace`},
		{"no key", func(o *v1alpha1.LoadBalancerWebhook) { o.Spec.SecretRef.Key = "other" }, `secretRef: Secret "hook" has no key "other"`},
		{"empty key", func(o *v1alpha1.LoadBalancerWebhook) { o.Spec.SecretRef.Name = "empty" }, `Secret "empty" has no key "hmac"`},
		{"bad CA", func(o *v1alpha1.LoadBalancerWebhook) { o.Spec.CABundle = "not a certificate" }, "holds no PEM certificate"},
		{"CA of no ConfigMap", func(o *v1alpha1.LoadBalancerWebhook) {
			o.Spec.CAFrom = &v1alpha1.CASource{ConfigMapKeyRef: &v1alpha1.SecretKeyRef{Name: "ca", Key: "ca.pem"}}
		}, `caFrom.configMapKeyRef: no ConfigMap "ca"`},
		{"CA from both", func(o *v1alpha1.LoadBalancerWebhook) {
			o.Spec.CAFrom = &v1alpha1.CASource{ConfigMapKeyRef: &v1alpha1.SecretKeyRef{Name: "ca", Key: "a"}, SecretKeyRef: &v1alpha1.SecretKeyRef{Name: "hook", Key: "hmac"}}
		}, "exactly one of secretKeyRef and configMapKeyRef"},
		{"http", func(o *v1alpha1.LoadBalancerWebhook) { o.Spec.URL = "http://127.0.0.1:8080/" }, "allowInsecureHTTP"},
		{"bad selector", func(o *v1alpha1.LoadBalancerWebhook) {
			o.Spec.IPAddressPoolSelectors = []metav1.LabelSelector{{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Sometimes"}}}}
		}, "ipAddressPoolSelectors[0]"},
	} {
		o := testWebhook("lb", 1, "https://lb.example.net/")
		c.mod(o)
		out, _ := convertCRDs(Config{}, crdObjects{webhooks: []*v1alpha1.LoadBalancerWebhook{o}, secrets: secrets}, crdMemory{})
		wantInvalid(t, out, kindWebhook, "lb", c.want)
		if out.cfg.Webhook != nil {
			t.Errorf("%s: a webhook is in force: %+v", c.name, out.cfg.Webhook)
		}
	}

	older, newer := testWebhook("older", 1, "https://a.example.net/"), testWebhook("newer", 2, "https://b.example.net/")
	out, _ := convertCRDs(Config{}, crdObjects{webhooks: []*v1alpha1.LoadBalancerWebhook{newer, older}, secrets: secrets}, crdMemory{})
	wantInvalid(t, out, kindWebhook, "newer", "LoadBalancerWebhook older is in force")
	if out.cfg.Webhook == nil || out.cfg.Webhook.URL != "https://a.example.net/" {
		t.Errorf("two webhooks: %+v in force, want the older's", out.cfg.Webhook)
	}
}

// An accepted webhook whose Secret goes, or that is changed to something
// invalid, keeps its last accepted version (with its key) in force; a
// process that never saw it accepted has none. A Secret change is a new
// key at once.
func TestConvertWebhookLastGood(t *testing.T) {
	o := testWebhook("lb", 1, "https://lb.example.net/")
	in := crdObjects{webhooks: []*v1alpha1.LoadBalancerWebhook{o}, secrets: map[string]map[string][]byte{"hook": {"hmac": []byte("one")}}}
	_, mem := convertCRDs(Config{}, in, crdMemory{})

	in.secrets["hook"] = map[string][]byte{"hmac": []byte("two")}
	c, mem := convertCRDs(Config{}, in, mem)
	if c.cfg.Webhook == nil || c.cfg.Webhook.Secret != "two" {
		t.Fatalf("after the Secret changed: %+v, want key two", c.cfg.Webhook)
	}

	delete(in.secrets, "hook")
	c, mem = convertCRDs(Config{}, in, mem)
	v := verdictOf(t, c, kindWebhook, "lb")
	if v.err == nil || !v.stale || c.cfg.Webhook == nil || c.cfg.Webhook.Secret != "two" {
		t.Fatalf("Secret deleted: verdict %v (stale %v), webhook %+v; want invalid, the last good (key two) in force", v.err, v.stale, c.cfg.Webhook)
	}
	if s := statusOf(v, nil); s.reason != v1alpha1.ReasonInvalid || !strings.Contains(s.message, "last accepted version stays in force") {
		t.Errorf("status %+v", s)
	}

	o2 := *o
	o2.Spec.URL = "http://lb.example.net/"
	in.webhooks = []*v1alpha1.LoadBalancerWebhook{&o2}
	in.secrets = map[string]map[string][]byte{"hook": {"hmac": []byte("three")}}
	c, _ = convertCRDs(Config{}, in, mem)
	if c.cfg.Webhook == nil || c.cfg.Webhook.URL != "https://lb.example.net/" || c.cfg.Webhook.Secret != "two" {
		t.Errorf("changed to plain http: %+v in force, want the last good", c.cfg.Webhook)
	}
	c, _ = convertCRDs(Config{}, in, crdMemory{})
	if c.cfg.Webhook != nil {
		t.Errorf("a fresh process runs %+v of an invalid webhook", c.cfg.Webhook)
	}
}

// The pool selection picks pools by name or label; the webhook is then
// told only about their addresses: not about other pools', nor about
// addresses in no pool.
func TestWebhookPoolSelection(t *testing.T) {
	pub := testPool("public", 1, "203.0.113.0/28")
	pub.Labels = map[string]string{"exposure": "public"}
	in := crdObjects{pools: []*v1alpha1.LoadBalancerIPPool{pub, testPool("internal", 2, "198.51.100.0/28"), testPool("named", 3, "192.0.2.0/28")},
		secrets: map[string]map[string][]byte{"hook": {"hmac": []byte("k")}}}
	o := testWebhook("lb", 1, "https://lb.example.net/")
	o.Spec.IPAddressPools = []string{"named"}
	o.Spec.IPAddressPoolSelectors = []metav1.LabelSelector{{MatchLabels: map[string]string{"exposure": "public"}}}
	in.webhooks = []*v1alpha1.LoadBalancerWebhook{o}
	c, _ := convertCRDs(Config{}, in, crdMemory{})
	if want := map[string]bool{"public": true, "named": true}; !reflect.DeepEqual(c.cfg.webhookPools, want) {
		t.Fatalf("pools picked %v, want %v", c.cfg.webhookPools, want)
	}
	p, err := c.cfg.parse()
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr
	st := &State{Leader: true, Targets: []Target{
		{IP: ip("203.0.113.1"), Service: portal.ServiceKey{Namespace: "a", Name: "pub"}},
		{IP: ip("198.51.100.1"), Service: portal.ServiceKey{Namespace: "a", Name: "int"}},
		{IP: ip("192.0.2.1"), Service: portal.ServiceKey{Namespace: "a", Name: "both"}},
		{IP: ip("198.51.100.2"), Service: portal.ServiceKey{Namespace: "a", Name: "both"}},
		{IP: ip("10.9.9.9"), Service: portal.ServiceKey{Namespace: "a", Name: "ext"}},
	}}
	var got []string
	for _, pl := range webhookPayloads(st, p.webhookPicks) {
		got = append(got, pl.Service+"="+strings.Join(pl.IPs, ","))
	}
	if want := []string{"a/both=192.0.2.1", "a/pub=203.0.113.1"}; !slices.Equal(got, want) {
		t.Errorf("payloads %v, want %v", got, want)
	}
	// No selection: everything, the address in no pool too.
	o.Spec.PoolSelection = v1alpha1.PoolSelection{}
	c, _ = convertCRDs(Config{}, in, crdMemory{})
	if p, _ = c.cfg.parse(); len(webhookPayloads(st, p.webhookPicks)) != 4 {
		t.Errorf("no selection: %v", webhookPayloads(st, p.webhookPicks))
	}
}

// The sender starts again when anything it runs with changes (the key
// say, or the pools it picks), and not on other changes.
func TestSameWebhook(t *testing.T) {
	a := &parsed{Config: Config{Webhook: &webhook.Config{URL: "https://x/", Secret: "one"}, webhookPools: map[string]bool{"a": true}}}
	b := &parsed{Config: Config{Webhook: &webhook.Config{URL: "https://x/", Secret: "one"}, webhookPools: map[string]bool{"a": true}},
		pools: nil}
	b.Pools = []PoolConfig{{Name: "a", Addresses: []string{"192.0.2.1"}}}
	if !sameWebhook(a, b) {
		t.Error("a pool change alone restarts the sender")
	}
	b.Webhook = &webhook.Config{URL: "https://x/", Secret: "two"}
	if sameWebhook(a, b) {
		t.Error("a new key does not restart the sender")
	}
	b.Webhook, b.webhookPools = a.Webhook, map[string]bool{"b": true}
	if sameWebhook(a, b) {
		t.Error("a new pool selection does not restart the sender")
	}
}

// The CA bundle comes inline, from a Secret or from a ConfigMap, as is.
func TestConvertWebhookCASources(t *testing.T) {
	ca := testCA(t)
	ref := &v1alpha1.SecretKeyRef{Name: "ca", Key: "ca.pem"}
	for name, src := range map[string]func(*v1alpha1.LoadBalancerWebhookSpec){
		"inline":    func(s *v1alpha1.LoadBalancerWebhookSpec) { s.CABundle = ca },
		"Secret":    func(s *v1alpha1.LoadBalancerWebhookSpec) { s.CAFrom = &v1alpha1.CASource{SecretKeyRef: ref} },
		"ConfigMap": func(s *v1alpha1.LoadBalancerWebhookSpec) { s.CAFrom = &v1alpha1.CASource{ConfigMapKeyRef: ref} },
	} {
		o := testWebhook("lb", 1, "https://lb.example.net/")
		src(&o.Spec)
		in := crdObjects{webhooks: []*v1alpha1.LoadBalancerWebhook{o},
			secrets:    map[string]map[string][]byte{"hook": {"hmac": []byte("k")}, "ca": {"ca.pem": []byte(ca)}},
			configMaps: map[string]map[string][]byte{"ca": {"ca.pem": []byte(ca)}}}
		c, _ := convertCRDs(Config{}, in, crdMemory{})
		if c.cfg.Webhook == nil || string(c.cfg.Webhook.CA) != ca {
			t.Errorf("CA %s: webhook %+v, verdicts %+v", name, c.cfg.Webhook, c.verdicts)
		}
	}
}
