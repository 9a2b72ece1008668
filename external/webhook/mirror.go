package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
)

// Mirror is a receiver's copy of the desired state, built from verified
// request bodies by the generation rules of external/README.md:
//
//   - a Service's state is applied only when its generation is above the
//     generation the Mirror holds for that Service (deletions included) and
//     above the newest snapshot applied;
//   - a snapshot is applied only when it is newer than the newest snapshot
//     applied; a Service it lists is applied as above, and a Service it does
//     not list is deleted unless the Mirror holds a newer generation for it.
//
// So requests may arrive late, twice or out of order, from an old leader or
// a new one, and the Mirror still ends at the newest state. It is safe for
// concurrent use.
type Mirror struct {
	mu sync.Mutex
	// floor is the generation of the newest snapshot applied.
	floor uint64
	// gens is the generation of each Service's state held, and of the
	// deletion of Services deleted since the last snapshot.
	gens     map[string]uint64
	services map[string]Payload
}

// NewMirror returns an empty Mirror.
func NewMirror() *Mirror {
	return &Mirror{gens: map[string]uint64{}, services: map[string]Payload{}}
}

// Apply applies one request body (a Payload or a Snapshot) and returns the
// names of the Services whose state it set or deleted, sorted; nothing when
// the body was older than what the Mirror holds. Verify the request first.
func (m *Mirror) Apply(body []byte) ([]string, error) {
	var kind struct {
		Snapshot bool `json:"snapshot"`
	}
	if err := json.Unmarshal(body, &kind); err != nil {
		return nil, fmt.Errorf("webhook: body: %w", err)
	}
	if kind.Snapshot {
		var s Snapshot
		if err := json.Unmarshal(body, &s); err != nil {
			return nil, fmt.Errorf("webhook: snapshot: %w", err)
		}
		return m.ApplySnapshot(s), nil
	}
	var p Payload
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, fmt.Errorf("webhook: payload: %w", err)
	}
	if p.Service == "" {
		return nil, fmt.Errorf("webhook: payload without a service")
	}
	if m.ApplyPayload(p) {
		return []string{p.Service}, nil
	}
	return nil, nil
}

// ApplyPayload applies one Service's state and reports whether it set or
// deleted anything.
func (m *Mirror) ApplyPayload(p Payload) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.apply(p)
}

// apply: caller holds m.mu.
func (m *Mirror) apply(p Payload) bool {
	if p.Generation <= m.floor || p.Generation <= m.gens[p.Service] {
		return false
	}
	m.gens[p.Service] = p.Generation
	if p.Deleted {
		_, had := m.services[p.Service]
		delete(m.services, p.Service)
		return had
	}
	m.services[p.Service] = p
	return true
}

// ApplySnapshot applies a snapshot and returns the Services whose state it
// set or deleted, sorted.
func (m *Mirror) ApplySnapshot(s Snapshot) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Generation <= m.floor {
		return nil
	}
	var changed []string
	listed := map[string]bool{}
	for _, p := range s.Services {
		p.Generation = s.Generation
		p.Deleted = false
		listed[p.Service] = true
		if m.apply(p) {
			changed = append(changed, p.Service)
		}
	}
	m.floor = s.Generation
	for svc, gen := range m.gens {
		if listed[svc] || gen > s.Generation {
			continue
		}
		if _, had := m.services[svc]; had {
			delete(m.services, svc)
			changed = append(changed, svc)
		}
		// The floor now rejects everything this entry guarded against.
		delete(m.gens, svc)
	}
	slices.Sort(changed)
	return slices.Compact(changed)
}

// Service returns the state held for a Service; false when it has none
// (never sent, or deleted).
func (m *Mirror) Service(name string) (Payload, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.services[name]
	return p, ok
}

// Services returns every Service's state held, sorted by name.
func (m *Mirror) Services() []Payload {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Payload, 0, len(m.services))
	for _, p := range m.services {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Payload) int {
		switch {
		case a.Service < b.Service:
			return -1
		case a.Service > b.Service:
			return 1
		}
		return 0
	})
	return out
}
