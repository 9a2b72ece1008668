package soak

import (
	"reflect"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func newTestModel(seed uint64) *Model {
	return NewModel("churn", 25, 8, []int{8080, 8081, 5353}, []int{8080, 5353}, seed)
}

// The stream is a function of the seed.
func TestModelIsSeeded(t *testing.T) {
	a, b, c := newTestModel(1), newTestModel(1), newTestModel(2)
	same := true
	for i := range 1000 {
		x, y, z := a.Next(), b.Next(), c.Next()
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("change %d: %+v and %+v from the same seed", i, x, y)
		}
		same = same && reflect.DeepEqual(x, z)
	}
	if same {
		t.Error("seeds 1 and 2 made the same stream")
	}
}

// Every change is one the API server takes (ports unique per protocol,
// endpoints distinct pods, externalTrafficPolicy only on NodePort
// Services), every kind comes up, and the number of Services stays near
// half the slots.
func TestModelStream(t *testing.T) {
	m := newTestModel(7)
	seen := map[Kind]int{}
	lo, hi := len(m.slots), 0
	for i := range 20000 {
		ch := m.Next()
		seen[ch.Kind]++
		if got := m.slots[ch.Slot]; ch.Kind == Delete && got != nil || ch.Kind != Delete && !reflect.DeepEqual(*got, ch.Spec) {
			t.Fatalf("change %d (%v): the model holds %+v, the change says %+v", i, ch.Kind, got, ch.Spec)
		}
		if ch.Kind != Delete {
			checkSpec(t, ch)
		}
		if i > 1000 {
			lo, hi = min(lo, m.Present()), max(hi, m.Present())
		}
	}
	for k := range kinds {
		if seen[k] == 0 {
			t.Errorf("no %v change in 20000", k)
		}
	}
	if lo < 3 || hi > 22 {
		t.Errorf("Services present ranged %d to %d of 25 after warm-up", lo, hi)
	}
	t.Logf("kinds %v; Services present %d to %d of 25", seen, lo, hi)
}

func checkSpec(t *testing.T, ch Change) {
	t.Helper()
	s := ch.Spec
	if len(s.Ports) == 0 || len(s.Endpoints) > maxEndpoints || s.Local && !s.NodePort {
		t.Fatalf("%v %s: %+v", ch.Kind, ch.Name, s)
	}
	type key struct {
		proto v1.Protocol
		port  int32
	}
	ports := map[key]bool{}
	for _, p := range s.Ports {
		if ports[key{p.Protocol, p.Port}] {
			t.Fatalf("%v %s: port %s/%d twice: %+v", ch.Kind, ch.Name, p.Protocol, p.Port, s)
		}
		ports[key{p.Protocol, p.Port}] = true
	}
	if !slices.IsSorted(s.Endpoints) || len(slices.Compact(slices.Clone(s.Endpoints))) != len(s.Endpoints) {
		t.Fatalf("%v %s: endpoints %v", ch.Kind, ch.Name, s.Endpoints)
	}
}
