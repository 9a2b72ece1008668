package metallb

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/onehop/onehop/external/api/v1alpha1"
	"github.com/onehop/onehop/external/config"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// metalLBGolden is what a conversion prints: the YAML, then the warnings.
func metalLBGolden(t *testing.T, c Conversion) string {
	t.Helper()
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.Write(y)
	b.WriteString("# warnings:\n")
	for _, w := range c.Warnings {
		fmt.Fprintf(&b, "# - %s\n", w)
	}
	return b.String()
}

// Each testdata/metallb-*.yaml converts to its .golden: onehop's
// resources and the warnings of what did not carry over.
func TestConvertMetalLBGolden(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/metallb-*.yaml")
	if len(inputs) == 0 {
		t.Fatal("no testdata/metallb-*.yaml")
	}
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			b, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			c, err := Convert(Options{}, b)
			if err != nil {
				t.Fatal(err)
			}
			got := metalLBGolden(t, c)
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from %s (run with -update and review the diff):\n%s", in, golden, got)
			}
			checkAcceptedByHook(t, c)
		})
	}
}

// checkAcceptedByHook decodes the converted objects strictly into onehop's
// types and has the hook's own conversion accept every one, with the
// Secrets they name present.
func checkAcceptedByHook(t *testing.T, c Conversion) {
	t.Helper()
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	in := config.Objects{Secrets: map[string]map[string][]byte{}}
	for i, doc := range strings.Split(string(y), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, doc)
		}
		if meta.Kind == "Secret" {
			continue
		}
		obj := in.Add(meta.Kind)
		if obj == nil {
			t.Fatalf("output of unknown kind %q:\n%s", meta.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("%s: %v\n%s", meta.Kind, err, doc)
		}
		obj.SetUID(types.UID(fmt.Sprint(i)))
	}
	for _, p := range in.Peers {
		if ref := p.Spec.PasswordSecret; ref != nil {
			in.Secrets[ref.Name] = map[string][]byte{ref.Key: []byte("pw")}
		}
	}
	cc, _ := config.Convert(config.Config{}, in, config.Memory{})
	for _, v := range cc.Verdicts {
		if v.Err != nil {
			t.Errorf("converted %s %s is not accepted: %v", v.Kind, v.Name, v.Err)
		}
	}
}

func TestConvertMetalLB(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		err      string   // Convert fails with this
		kinds    []string // the kinds written, in order
		warn     []string // each is in some warning
		out      []string // each is in the YAML
	}{
		{name: "empty input", in: "# nothing\n---\n"},
		{name: "not YAML", in: "kind: [", err: "not YAML"},
		{name: "not an object", in: "just: data\n", err: "not a Kubernetes object"},
		{name: "dynamicASN cannot be carried",
			in:   "apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {name: p, namespace: metallb-system}\nspec: {myASN: 64512, dynamicASN: external, peerAddress: 192.0.2.1}\n",
			warn: []string{"BGPPeer metallb-system/p: dynamicASN"}},
		{name: "iBGP multihop is dropped",
			in:    "apiVersion: metallb.io/v1beta1\nkind: BGPPeer\nmetadata: {name: p}\nspec: {myASN: 64512, peerASN: 64512, peerAddress: 192.0.2.1, ebgpMultiHop: true}\n",
			kinds: []string{config.KindPeer}, warn: []string{"iBGP is multihop"}},
		{name: "same name in two namespaces",
			in: "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p, namespace: a}\nspec: {addresses: [192.0.2.0/28]}\n---\n" +
				"apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p, namespace: b}\nspec: {addresses: [192.0.2.16/28]}\n",
			kinds: []string{config.KindPool}, warn: []string{"IPAddressPool b/p: onehop's LoadBalancerIPPool is cluster-scoped"}},
		{name: "bad addresses are left out",
			in:    "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.9-192.0.2.1, 192.0.2.1-2001:db8::1, nonsense, 192.0.2.64/26]}\n",
			kinds: []string{config.KindPool}, warn: []string{"ends before it starts", "two families", `"nonsense"`},
			out: []string{"- 192.0.2.64/26\n"}},
		{name: "no usable address, no pool",
			in:   "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [nonsense]}\n",
			warn: []string{"no address onehop can use"}},
		{name: "avoidBuggyIPs trims .0 and .255",
			in:    "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {avoidBuggyIPs: true, addresses: [192.0.2.0/24, 198.51.100.0/32, 203.0.113.8/29]}\n",
			kinds: []string{config.KindPool}, warn: []string{`"198.51.100.0/32" holds only addresses avoidBuggyIPs avoids`},
			out: []string{"- 192.0.2.1-192.0.2.254\n", "- 203.0.113.8/29\n"}},
		{name: "pools come first",
			in: "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata: {name: l}\n---\n" +
				"apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.0/24]}\n",
			kinds: []string{config.KindPool, config.KindL2Ad}, out: []string{"avoidNetworkAndBroadcast: false"}},
		{name: "a plain password becomes a Secret",
			in:    "apiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {name: p}\nspec: {myASN: 1, peerASN: 2, peerAddress: 192.0.2.1, password: pw}\n",
			kinds: []string{"Secret", config.KindPeer},
			out:   []string{"name: p-bgp-password\n  namespace: kube-system\nstringData:\n  password: pw\n", "passwordSecret:\n    key: password\n    name: p-bgp-password\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Convert(Options{}, []byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, o := range c.Objects {
				kinds = append(kinds, o.Kind)
			}
			if strings.Join(kinds, ",") != strings.Join(tc.kinds, ",") {
				t.Errorf("kinds %v, want %v", kinds, tc.kinds)
			}
			all := strings.Join(c.Warnings, "\n")
			for _, w := range tc.warn {
				if !strings.Contains(all, w) {
					t.Errorf("no warning with %q in:\n%s", w, all)
				}
			}
			if len(tc.warn) == 0 && len(c.Warnings) > 0 {
				t.Errorf("unexpected warnings:\n%s", all)
			}
			y, _ := c.YAML()
			for _, o := range tc.out {
				if !strings.Contains(string(y), o) {
					t.Errorf("output lacks %q:\n%s", o, y)
				}
			}
			checkAcceptedByHook(t, c)
		})
	}
}

// metalLBDocExample is the worked example of docs/metallb.md: MetalLB's
// resources, and what convert-metallb prints of them on stdout and stderr.
func metalLBDocExample(t *testing.T) (in, out, stderr string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/metallb.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```(yaml|text)\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		switch {
		case m[1] == "yaml" && strings.Contains(m[2], "apiVersion: metallb.io/"):
			in = m[2]
		case m[1] == "yaml" && strings.Contains(m[2], "apiVersion: "+v1alpha1.GroupVersion.String()):
			out = m[2]
		case m[1] == "text" && strings.HasPrefix(m[2], "warning: "):
			stderr = m[2]
		}
	}
	if in == "" || out == "" || stderr == "" {
		t.Fatal("docs/metallb.md lacks its example's MetalLB resources, onehop's, or the warnings")
	}
	return in, out, stderr
}

// docs/metallb.md's worked example shows what convert-metallb prints, to
// the letter, and what it prints is accepted.
func TestMetalLBDocExample(t *testing.T) {
	in, out, stderr := metalLBDocExample(t)
	c, err := Convert(Options{SecretNamespace: "onehop-leases"}, []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if string(y) != out {
		t.Errorf("docs/metallb.md shows another output than convert-metallb's:\n%s", y)
	}
	var warnings strings.Builder
	for _, w := range c.Warnings {
		fmt.Fprintf(&warnings, "warning: %s\n", w)
	}
	if warnings.String() != stderr {
		t.Errorf("docs/metallb.md shows other warnings than convert-metallb's:\n%s", warnings.String())
	}
	checkAcceptedByHook(t, c)
}
