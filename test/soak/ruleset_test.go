package soak

import (
	"strings"
	"testing"
)

// Diff ignores what two healthy agents may differ in (which endpoint map
// holds a Service port, the anonymous sets' kernel names, the clients an
// affinity set remembers) and reports everything else.
func TestDiff(t *testing.T) {
	want := &Ruleset{
		Chains: map[string]int{"services": 8, "svc4/default/a/tcp/p0": 1},
		Sets: map[string][]string{
			"vips4":                          {"0a600001 : goto svc4/default/a/tcp/p0", "0a600002 : goto svc4/default/b/tcp/p0"},
			"endpoints4-01":                  {"01000000 : 0af40102", "01000001 : 0af40103"},
			"endpoints4-02":                  {},
			"__map0":                         {"00000000 : goto aep4/x", "01000000 : goto aep4/y"},
			"aff4/default/a/tcp/p0@10.0.0.1": {},
		},
	}
	healthy := &Ruleset{
		Chains: map[string]int{"services": 8, "svc4/default/a/tcp/p0": 1},
		Sets: map[string][]string{
			"vips4":                          {"0a600001 : goto svc4/default/a/tcp/p0", "0a600002 : goto svc4/default/b/tcp/p0"},
			"endpoints4-01":                  {},
			"endpoints4-07":                  {"07000000 : 0af40102", "07000001 : 0af40103"},
			"__map5":                         {"00000000 : goto aep4/x"},
			"__map9":                         {"01000000 : goto aep4/y"},
			"aff4/default/a/tcp/p0@10.0.0.1": {"0a000005"},
		},
	}
	if d := Diff(healthy, want); len(d) > 0 {
		t.Errorf("a healthy table: %v", d)
	}
	drifted := &Ruleset{
		Chains: map[string]int{"services": 8, "svc4/default/a/tcp/p0": 2, "svc4/default/gone/tcp/p0": 1},
		Sets: map[string][]string{
			"vips4":         {"0a600001 : goto svc4/default/a/tcp/p0", "0a600003 : goto svc4/default/gone/tcp/p0"},
			"endpoints4-01": {"01000000 : 0af40102"},
			"__map0":        {"00000000 : goto aep4/x", "01000000 : goto aep4/y", "02000000 : goto aep4/z"},
		},
	}
	d := strings.Join(Diff(drifted, want), "\n")
	for _, w := range []string{
		"chain svc4/default/a/tcp/p0: 2 rules, want 1",
		"chain svc4/default/gone/tcp/p0 extra",
		"set vips4: extra element 0a600003",
		"set vips4: missing element 0a600002",
		"endpoints4-*: 1 elements, want 2",
		"set anonymous sets: extra element 02000000",
		"set aff4/default/a/tcp/p0@10.0.0.1 missing",
	} {
		if !strings.Contains(d, w) {
			t.Errorf("the diff lacks %q:\n%s", w, d)
		}
	}
}
