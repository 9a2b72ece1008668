package config

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// kubeProxyStructPaths lists the JSON paths of KubeProxyConfiguration's
// fields, descending into the sections kubeProxyFields lists field by field.
func kubeProxyStructPaths() []string {
	sections := map[string]bool{"clientConnection": true, "logging": true, "iptables": true, "ipvs": true,
		"nftables": true, "winkernel": true, "detectLocal": true, "conntrack": true}
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Anonymous || name == "" || name == "-" {
				continue // TypeMeta: apiVersion and kind
			}
			path := prefix + name
			if sections[path] && f.Type.Kind() == reflect.Struct {
				walk(f.Type, path+".")
				continue
			}
			out = append(out, path)
		}
	}
	walk(reflect.TypeOf(kubeproxy.KubeProxyConfiguration{}), "")
	return out
}

// Every field of KubeProxyConfiguration has a status, and only they do.
func TestKubeProxyFieldsCoverTheStruct(t *testing.T) {
	var listed []string
	for _, f := range kubeProxyFields {
		if slices.Contains(listed, f.Path) {
			t.Errorf("%s listed twice", f.Path)
		}
		listed = append(listed, f.Path)
		switch f.Status {
		case fieldApplied:
		case fieldRefused, fieldNotApplicable:
			if f.Example == "" {
				t.Errorf("%s (%s) has no example value", f.Path, f.Status)
			}
		default:
			t.Errorf("%s: unknown status %q", f.Path, f.Status)
		}
	}
	inStruct := kubeProxyStructPaths()
	for _, p := range inStruct {
		if !slices.Contains(listed, p) {
			t.Errorf("KubeProxyConfiguration field %s has no status in kubeProxyFields", p)
		}
	}
	for _, p := range listed {
		if !slices.Contains(inStruct, p) {
			t.Errorf("kubeProxyFields lists %s, which KubeProxyConfiguration does not have", p)
		}
	}
}

// docsFieldTable parses the table of fields in docs/migration.md: rows
// "| `path` | status | ... |" after a header whose first cell is "field".
func docsFieldTable(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("../docs/migration.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			in = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if len(cells) >= 2 && cells[0] == "KubeProxyConfiguration field" {
			in = true
			continue
		}
		if !in || strings.HasPrefix(cells[0], "---") || len(cells) < 2 {
			continue
		}
		path := strings.Trim(cells[0], "`")
		if _, dup := out[path]; dup {
			t.Errorf("docs/migration.md lists %s twice", path)
		}
		out[path] = cells[1]
	}
	if len(out) == 0 {
		t.Fatal("docs/migration.md has no table of KubeProxyConfiguration fields")
	}
	return out
}

// docs/migration.md's table says what the code does, field by field.
func TestKubeProxyFieldsDocumented(t *testing.T) {
	doc := docsFieldTable(t)
	for _, f := range kubeProxyFields {
		got, ok := doc[f.Path]
		switch {
		case !ok:
			t.Errorf("docs/migration.md: %s is missing (code: %s)", f.Path, f.Status)
		case got != f.Status:
			t.Errorf("docs/migration.md: %s is %q, the code says %q", f.Path, got, f.Status)
		}
		delete(doc, f.Path)
	}
	for p, s := range doc {
		t.Errorf("docs/migration.md lists %s (%s), which is not a KubeProxyConfiguration field", p, s)
	}
}

// configWith is a KubeProxyConfiguration (mode nftables) with path set to
// the JSON value v, as YAML.
func configWith(t *testing.T, path, v string, mode string) string {
	t.Helper()
	doc := map[string]any{"apiVersion": kubeProxyConfigAPIVersion, "kind": kubeProxyConfigKind, "mode": mode}
	var val any
	if err := json.Unmarshal([]byte(v), &val); err != nil {
		t.Fatalf("%s: example %s: %v", path, v, err)
	}
	parts := strings.Split(path, ".")
	m := doc
	for _, p := range parts[:len(parts)-1] {
		sub, ok := m[p].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[p] = sub
		}
		m = sub
	}
	m[parts[len(parts)-1]] = val
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// resolveWith resolves the default settings with the --config file path
// (none when empty) and the flags given (by name: the change each makes),
// as `agent run` resolves its command line.
func resolveWith(path string, flags map[string]func(*Settings)) ([]string, error) {
	s := Defaults()
	set := map[string]bool{}
	if path != "" {
		s.Config, set["config"] = path, true
	}
	for name, change := range flags {
		change(&s)
		set[name] = true
	}
	return s.Resolve(set)
}

// Nothing is silently ignored: a refused or not-applicable field that is
// set gets an error or a warning that names it, from the file and through
// the settings `agent run` resolves.
func TestKubeProxyFieldsNotSilent(t *testing.T) {
	for _, f := range kubeProxyFields {
		if f.Status == fieldApplied {
			continue
		}
		t.Run(f.Path, func(t *testing.T) {
			path := writeConfig(t, configWith(t, f.Path, f.Example, "nftables"))
			warnings, err := resolveWith(path, nil)
			named := err != nil && strings.Contains(err.Error(), f.Path)
			for _, w := range warnings {
				if strings.HasPrefix(w, f.Path+":") {
					named = true
				}
			}
			if !named {
				t.Errorf("%s = %s: err %v, warnings %q; want one naming the field", f.Path, f.Example, err, warnings)
			}
		})
	}
}

// The refused fields stop the agent where onehop cannot honour them.
func TestKubeProxyFieldsRefused(t *testing.T) {
	for _, tc := range []struct{ path, value, mode string }{
		{"ipvs.tcpTimeout", `"900s"`, "ipvs"},
		{"ipvs.tcpFinTimeout", `"120s"`, "ipvs"},
		{"ipvs.udpTimeout", `"300s"`, "ipvs"},
	} {
		path := writeConfig(t, configWith(t, tc.path, tc.value, tc.mode))
		if _, err := resolveWith(path, nil); err == nil || !strings.Contains(err.Error(), tc.path) {
			t.Errorf("%s with mode %s: err %v, want one naming the field", tc.path, tc.mode, err)
		}
		// --dataplane ipvs over a file with mode nftables: refused too.
		path = writeConfig(t, configWith(t, tc.path, tc.value, "nftables"))
		ipvs := func(s *Settings) { s.Dataplane = DataplaneIPVS }
		if _, err := resolveWith(path, map[string]func(*Settings){"dataplane": ipvs}); err == nil {
			t.Errorf("%s with --dataplane ipvs: no error", tc.path)
		}
	}
	for _, mode := range []string{"BridgeInterface", "InterfaceNamePrefix"} {
		detect := func(s *Settings) { s.DetectLocalMode = mode }
		if _, err := resolveWith("", map[string]func(*Settings){"detect-local-mode": detect}); err == nil ||
			!strings.Contains(err.Error(), "detectLocalMode (--detect-local-mode)") || !strings.Contains(err.Error(), "NodeCIDR") {
			t.Errorf("--detect-local-mode %s: err %v", mode, err)
		}
	}
}
