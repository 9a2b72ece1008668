package webhook

import (
	"encoding/json"
	"slices"
	"testing"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func body(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func held(m *Mirror) map[string]string {
	out := map[string]string{}
	for _, p := range m.Services() {
		out[p.Service] = p.Nodes[0].Name
	}
	return out
}

func TestMirrorGenerationRules(t *testing.T) {
	m := NewMirror()
	g := func(term, n uint64) uint64 { return Generation(term, n) }
	at := func(p Payload, gen uint64) Payload { p.Generation = gen; return p }
	del := func(name string, gen uint64) Payload {
		return Payload{Service: name, Deleted: true, Generation: gen}
	}
	steps := []struct {
		what    string
		msg     any
		changed []string
		want    map[string]string
	}{
		{"first state", at(svc("a", "n1"), g(1, 1)), []string{"a"}, map[string]string{"a": "n1"}},
		{"newer", at(svc("a", "n2"), g(1, 3)), []string{"a"}, map[string]string{"a": "n2"}},
		{"late retry", at(svc("a", "n1"), g(1, 2)), nil, map[string]string{"a": "n2"}},
		{"duplicate", at(svc("a", "n2"), g(1, 3)), nil, map[string]string{"a": "n2"}},
		{"b", at(svc("b", "n1"), g(1, 4)), []string{"b"}, map[string]string{"a": "n2", "b": "n1"}},
		{"b deleted", del("b", g(1, 5)), []string{"b"}, map[string]string{"a": "n2"}},
		{"b's late retry does not resurrect it", at(svc("b", "n1"), g(1, 4)), nil, map[string]string{"a": "n2"}},
		{"c", at(svc("c", "n1"), g(1, 6)), []string{"c"}, map[string]string{"a": "n2", "c": "n1"}},
		// Term 2 sends an update of d before its snapshot arrives.
		{"term 2 update first", at(svc("d", "n4"), g(2, 2)), []string{"d"}, map[string]string{"a": "n2", "c": "n1", "d": "n4"}},
		{"term 2 snapshot: c deleted during the hand-over, d kept newer", Snapshot{Snapshot: true, Generation: g(2, 1),
			Services: []Payload{svc("a", "n3"), svc("d", "n1")}}, []string{"a", "c"}, map[string]string{"a": "n3", "d": "n4"}},
		{"term 1 arrives late", at(svc("c", "n1"), g(1, 7)), nil, map[string]string{"a": "n3", "d": "n4"}},
		{"b's term 1 retry after the snapshot", at(svc("b", "n1"), g(1, 4)), nil, map[string]string{"a": "n3", "d": "n4"}},
		{"an older snapshot", Snapshot{Snapshot: true, Generation: g(1, 9), Services: []Payload{svc("x", "n1")}}, nil, map[string]string{"a": "n3", "d": "n4"}},
		{"term 3 snapshot empties", Snapshot{Snapshot: true, Generation: g(3, 1), Services: []Payload{}}, []string{"a", "d"}, map[string]string{}},
	}
	for _, s := range steps {
		changed, err := m.Apply(body(t, s.msg))
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if !slices.Equal(changed, s.changed) || !equalMaps(held(m), s.want) {
			t.Fatalf("%s: changed %v, holds %v; want %v, %v", s.what, changed, held(m), s.changed, s.want)
		}
	}
	if len(m.gens) != 0 {
		t.Fatalf("generations kept after an empty snapshot: %v", m.gens)
	}
	if _, err := m.Apply([]byte(`{"generation":1}`)); err == nil {
		t.Fatal("a payload without a service was accepted")
	}
	if _, err := m.Apply([]byte(`[`)); err == nil {
		t.Fatal("a broken body was accepted")
	}
}

func TestGenerationsGrowAcrossTerms(t *testing.T) {
	if Generation(5, maxCount) >= Generation(6, 1) || TermOf(Generation(6, 1)) != 6 {
		t.Fatal("the last generation of a term is not below the next term's first")
	}
	if Generation(1<<21-1, maxCount) >= 1<<53 {
		t.Fatal("generations of the first 2^21 terms are not exact in JavaScript")
	}
}
