package config

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
	in := Objects{Webhooks: []*v1alpha1.LoadBalancerWebhook{o},
		Secrets:    map[string]map[string][]byte{"hook": {"hmac": []byte("k3y\n")}},
		ConfigMaps: map[string]map[string][]byte{"ca": {"ca.pem": []byte(ca)}}}
	base := Config{Webhook: &webhook.Config{URL: "https://file.example.net/", SecretFile: "/etc/onehop/key"}}
	c, mem := Convert(base, in, Memory{})
	want := webhook.Config{URL: "https://lb.example.net/onehop", Secret: "k3y", CA: []byte(ca), TimeoutSeconds: 3, MaxBackoffSeconds: 7}
	if c.Config.Webhook == nil || !reflect.DeepEqual(*c.Config.Webhook, want) {
		t.Fatalf("webhook %+v, want %+v", c.Config.Webhook, want)
	}
	if c.Config.webhookPools != nil {
		t.Errorf("no pool selection picks pools %v, want every address", c.Config.webhookPools)
	}
	v := verdictOf(t, c, KindWebhook, "lb")
	if s := statusOf(v, nil); v.Err != nil || !strings.Contains(s.message, "in place of the configuration file's webhook section") {
		t.Errorf("Verdict %v, status %q: want accepted, saying it replaces the file's", v.Err, s.message)
	}
	if got := c.WebhookSource(base); !strings.Contains(got, "LoadBalancerWebhook lb") {
		t.Errorf("source %q", got)
	}
	if _, ok := mem.webhooks[o.UID]; !ok {
		t.Error("the accepted webhook is not remembered")
	}
	// Without one, the file's section stays.
	c, _ = Convert(base, Objects{}, Memory{})
	if c.Config.Webhook != base.Webhook || c.WebhookSource(base) != "the configuration file" {
		t.Errorf("no LoadBalancerWebhook: webhook %+v from %q, want the file's", c.Config.Webhook, c.WebhookSource(base))
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
		out, _ := Convert(Config{}, Objects{Webhooks: []*v1alpha1.LoadBalancerWebhook{o}, Secrets: secrets}, Memory{})
		wantInvalid(t, out, KindWebhook, "lb", c.want)
		if out.Config.Webhook != nil {
			t.Errorf("%s: a webhook is in force: %+v", c.name, out.Config.Webhook)
		}
	}

	older, newer := testWebhook("older", 1, "https://a.example.net/"), testWebhook("newer", 2, "https://b.example.net/")
	out, _ := Convert(Config{}, Objects{Webhooks: []*v1alpha1.LoadBalancerWebhook{newer, older}, Secrets: secrets}, Memory{})
	wantInvalid(t, out, KindWebhook, "newer", "LoadBalancerWebhook older is in force")
	if out.Config.Webhook == nil || out.Config.Webhook.URL != "https://a.example.net/" {
		t.Errorf("two webhooks: %+v in force, want the older's", out.Config.Webhook)
	}
}

// An accepted webhook whose Secret goes, or that is changed to something
// invalid, keeps its last accepted version (with its key) in force; a
// process that never saw it accepted has none. A Secret change is a new
// key at once.
func TestConvertWebhookLastGood(t *testing.T) {
	o := testWebhook("lb", 1, "https://lb.example.net/")
	in := Objects{Webhooks: []*v1alpha1.LoadBalancerWebhook{o}, Secrets: map[string]map[string][]byte{"hook": {"hmac": []byte("one")}}}
	_, mem := Convert(Config{}, in, Memory{})

	in.Secrets["hook"] = map[string][]byte{"hmac": []byte("two")}
	c, mem := Convert(Config{}, in, mem)
	if c.Config.Webhook == nil || c.Config.Webhook.Secret != "two" {
		t.Fatalf("after the Secret changed: %+v, want key two", c.Config.Webhook)
	}

	delete(in.Secrets, "hook")
	c, mem = Convert(Config{}, in, mem)
	v := verdictOf(t, c, KindWebhook, "lb")
	if v.Err == nil || !v.Stale || c.Config.Webhook == nil || c.Config.Webhook.Secret != "two" {
		t.Fatalf("Secret deleted: Verdict %v (stale %v), webhook %+v; want invalid, the last good (key two) in force", v.Err, v.Stale, c.Config.Webhook)
	}
	if s := statusOf(v, nil); s.reason != v1alpha1.ReasonInvalid || !strings.Contains(s.message, "last accepted version stays in force") {
		t.Errorf("status %+v", s)
	}

	o2 := *o
	o2.Spec.URL = "http://lb.example.net/"
	in.Webhooks = []*v1alpha1.LoadBalancerWebhook{&o2}
	in.Secrets = map[string]map[string][]byte{"hook": {"hmac": []byte("three")}}
	c, _ = Convert(Config{}, in, mem)
	if c.Config.Webhook == nil || c.Config.Webhook.URL != "https://lb.example.net/" || c.Config.Webhook.Secret != "two" {
		t.Errorf("changed to plain http: %+v in force, want the last good", c.Config.Webhook)
	}
	c, _ = Convert(Config{}, in, Memory{})
	if c.Config.Webhook != nil {
		t.Errorf("a fresh process runs %+v of an invalid webhook", c.Config.Webhook)
	}
}

// The pool selection picks pools by name or label; the webhook is then
// told only about their addresses: not about other pools', nor about
// addresses in no pool.
func TestWebhookPoolSelection(t *testing.T) {
	pub := testPool("public", 1, "203.0.113.0/28")
	pub.Labels = map[string]string{"exposure": "public"}
	in := Objects{Pools: []*v1alpha1.LoadBalancerIPPool{pub, testPool("internal", 2, "198.51.100.0/28"), testPool("named", 3, "192.0.2.0/28")},
		Secrets: map[string]map[string][]byte{"hook": {"hmac": []byte("k")}}}
	o := testWebhook("lb", 1, "https://lb.example.net/")
	o.Spec.IPAddressPools = []string{"named"}
	o.Spec.IPAddressPoolSelectors = []metav1.LabelSelector{{MatchLabels: map[string]string{"exposure": "public"}}}
	in.Webhooks = []*v1alpha1.LoadBalancerWebhook{o}
	c, _ := Convert(Config{}, in, Memory{})
	if want := map[string]bool{"public": true, "named": true}; !reflect.DeepEqual(c.Config.webhookPools, want) {
		t.Fatalf("pools picked %v, want %v", c.Config.webhookPools, want)
	}
	p, err := c.Config.Parse()
	if err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr
	addrs := []netip.Addr{ip("203.0.113.1"), ip("198.51.100.1"), ip("192.0.2.1"), ip("198.51.100.2"), ip("10.9.9.9")}
	picked := func(p *Parsed) []netip.Addr {
		var out []netip.Addr
		for _, a := range addrs {
			if p.WebhookPicks(a) {
				out = append(out, a)
			}
		}
		return out
	}
	if got, want := picked(p), []netip.Addr{ip("203.0.113.1"), ip("192.0.2.1")}; !slices.Equal(got, want) {
		t.Errorf("told about %v, want %v", got, want)
	}
	// No selection: everything, the address in no pool too.
	o.Spec.PoolSelection = v1alpha1.PoolSelection{}
	c, _ = Convert(Config{}, in, Memory{})
	if p, _ = c.Config.Parse(); len(picked(p)) != len(addrs) {
		t.Errorf("no selection: told about %v", picked(p))
	}
}

// The sender starts again when anything it runs with changes (the key
// say, or the pools it picks), and not on other changes.
func TestSameWebhook(t *testing.T) {
	a := &Parsed{Config: Config{Webhook: &webhook.Config{URL: "https://x/", Secret: "one"}, webhookPools: map[string]bool{"a": true}}}
	b := &Parsed{Config: Config{Webhook: &webhook.Config{URL: "https://x/", Secret: "one"}, webhookPools: map[string]bool{"a": true}},
		IPAMPools: nil}
	b.Pools = []PoolConfig{{Name: "a", Addresses: []string{"192.0.2.1"}}}
	if !SameWebhook(a, b) {
		t.Error("a pool change alone restarts the sender")
	}
	b.Webhook = &webhook.Config{URL: "https://x/", Secret: "two"}
	if SameWebhook(a, b) {
		t.Error("a new key does not restart the sender")
	}
	b.Webhook, b.webhookPools = a.Webhook, map[string]bool{"b": true}
	if SameWebhook(a, b) {
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
		in := Objects{Webhooks: []*v1alpha1.LoadBalancerWebhook{o},
			Secrets:    map[string]map[string][]byte{"hook": {"hmac": []byte("k")}, "ca": {"ca.pem": []byte(ca)}},
			ConfigMaps: map[string]map[string][]byte{"ca": {"ca.pem": []byte(ca)}}}
		c, _ := Convert(Config{}, in, Memory{})
		if c.Config.Webhook == nil || string(c.Config.Webhook.CA) != ca {
			t.Errorf("CA %s: webhook %+v, verdicts %+v", name, c.Config.Webhook, c.Verdicts)
		}
	}
}
