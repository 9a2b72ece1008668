package external

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
	"github.com/onehop/onehop/external/metallb"
	"github.com/onehop/onehop/test/cluster"
)

// TestMetalLBAnnotationsAgainstAPIServer: a Service that carries only
// MetalLB's metallb.io/loadBalancerIPs gets that address in its status, as
// it did under MetalLB; one that also carries onehop's annotation gets
// onehop's address and an event saying the MetalLB one is ignored.
func TestMetalLBAnnotationsAgainstAPIServer(t *testing.T) {
	needs(t)
	tp := newTopo(t)
	tp.add("cp")
	_, c := tp.startControlPlane("cp", "")
	runHook(t, ipamConfig(), c, "n1")

	createLB(t, c, "from-metallb", 80, annotate("metallb.io/loadBalancerIPs", "192.0.2.2"))
	if ips := lbIPs(t, c, "from-metallb", "metallb.io/loadBalancerIPs", some); len(ips) != 1 || ips[0] != "192.0.2.2" {
		t.Fatalf("metallb.io/loadBalancerIPs 192.0.2.2: status %v", ips)
	}
	createLB(t, c, "pool-from-metallb", 80, annotate("metallb.universe.tf/address-pool", "manual"))
	if ips := lbIPs(t, c, "pool-from-metallb", "metallb.universe.tf/address-pool", some); !strings.HasPrefix(ips[0], "198.51.100.") {
		t.Fatalf("metallb.universe.tf/address-pool manual: status %v", ips)
	}
	createLB(t, c, "both", 80, annotate("metallb.io/loadBalancerIPs", "192.0.2.1"), annotate("onehop.io/load-balancer-ips", "192.0.2.3"))
	if ips := lbIPs(t, c, "both", "both annotations", some); len(ips) != 1 || ips[0] != "192.0.2.3" {
		t.Fatalf("onehop.io/load-balancer-ips 192.0.2.3 over metallb.io/loadBalancerIPs 192.0.2.1: status %v", ips)
	}
	msg := event(t, c, "both", "AnnotationIgnored")
	if !strings.Contains(msg, "metallb.io/loadBalancerIPs") || !strings.Contains(msg, "192.0.2.3") {
		t.Errorf("event %q does not name the ignored annotation and the address used", msg)
	}
}

// TestConvertMetalLBAgainstAPIServer: what agent convert-metallb makes of
// the MetalLB examples of external/metallb/testdata, and of docs/metallb.md's
// worked example, passes the onehop.io CRDs' schema and CEL rules of a real
// API server, and the controller of a split install accepts every object
// (with the Secrets a MetalLB passwordSecret named copied to the lease
// namespace, as the warnings say).
func TestConvertMetalLBAgainstAPIServer(t *testing.T) {
	t.Run("testdata", func(t *testing.T) {
		inputs, _ := filepath.Glob("../../external/metallb/testdata/metallb-*.yaml")
		if len(inputs) == 0 {
			t.Fatal("no ../../external/metallb/testdata/metallb-*.yaml")
		}
		var in [][]byte
		for _, f := range inputs {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in = append(in, b)
		}
		convertedAccepted(t, 8, in...)
	})
	t.Run("docs/metallb.md", func(t *testing.T) {
		b, err := os.ReadFile("../../docs/metallb.md")
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile("(?s)```yaml\n(apiVersion: metallb.io/.*?)```").FindStringSubmatch(string(b))
		if m == nil {
			t.Fatal("docs/metallb.md has no MetalLB example")
		}
		convertedAccepted(t, 5, []byte(m[1]))
	})
}

// convertedAccepted converts MetalLB's resources in, creates the result
// (at least want onehop objects) on a fresh API server and waits for each
// to be accepted.
func convertedAccepted(t *testing.T, want int, in ...[]byte) {
	conv, err := metallb.Convert(metallb.Options{SecretNamespace: splitLeaseNamespace}, in...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := conv.YAML()
	if err != nil {
		t.Fatal(err)
	}

	cp, _ := cluster.StartTest(t, "mlbconv", "192.0.2.5")
	c, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}
	cr := installCRDs(t, cp)
	sp := newSplit(t, cp)
	sp.runController(sp.config(config.Config{CRDs: true}), "onehop-controller-0", "")

	type created struct {
		gvr  schema.GroupVersionResource
		name string
	}
	var objs []created
	secrets := map[string]bool{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("converted output does not parse: %v\n%s", err, doc)
		}
		var gvr schema.GroupVersionResource
		switch u.GetKind() {
		case "Secret":
			gvr = corev1.SchemeGroupVersion.WithResource("secrets")
			secrets[u.GetName()] = true
		case "LoadBalancerIPPool":
			gvr = v1alpha1.LoadBalancerIPPools
		case "BGPPeer":
			gvr = v1alpha1.BGPPeers
			// The copy of the Secret a MetalLB passwordSecret names.
			if name, ok, _ := unstructured.NestedString(u.Object, "spec", "passwordSecret", "name"); ok && !secrets[name] {
				copied := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: splitLeaseNamespace, Name: name},
					Type: corev1.SecretTypeBasicAuth, Data: map[string][]byte{"password": []byte("pw")}}
				if _, err := c.CoreV1().Secrets(splitLeaseNamespace).Create(context.Background(), copied, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				secrets[name] = true
			}
		case "BGPAdvertisement":
			gvr = v1alpha1.BGPAdvertisements
		case "L2Advertisement":
			gvr = v1alpha1.L2Advertisements
		default:
			t.Fatalf("converted output of unknown kind %q", u.GetKind())
		}
		ri := cr.dyn.Resource(gvr)
		var err error
		if u.GetNamespace() != "" {
			_, err = ri.Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{})
		} else {
			_, err = ri.Create(context.Background(), u, metav1.CreateOptions{})
			objs = append(objs, created{gvr, u.GetName()})
		}
		if err != nil {
			t.Fatalf("the API server refuses converted %s %s: %v\n%s", u.GetKind(), u.GetName(), err, doc)
		}
	}
	if len(objs) < want {
		t.Fatalf("%d onehop objects converted, want %d", len(objs), want)
	}
	for _, o := range objs {
		cr.accepted(o.gvr, o.name, "True", "")
	}
	t.Logf("%d converted objects accepted", len(objs))
}
