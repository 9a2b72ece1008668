package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// The churn model: a fixed number of slots, each holding a Service or
// none, and a seeded random stream of changes to them. Every Service
// created gets a name never used before, as workloads that come and go
// do: state the agent keeps per name and fails to drop then grows with
// the run, instead of being reused by the next Service of the slot. The stream is a
// pure function of the seed: the same seed makes the same changes in the
// same order (what the API server and the agent make of them depends on
// timing). Creates and deletes pull the number of Services towards half
// the slots, so that what the agent holds wanders around a level instead
// of drifting: a drift would read as a leak.

// Kind is a kind of change.
type Kind int

// The kinds of change, with their share of the stream in percent.
const (
	Create   Kind = iota // a Service in an empty slot, with 0 to 3 endpoints
	Delete               // a Service and its EndpointSlices
	Scale                // one endpoint more or fewer
	Replace              // a pod replaced: one endpoint swapped for another pod
	Ports                // one port's number and target port changed
	Traffic              // externalTrafficPolicy flipped (NodePort Services)
	Affinity             // ClientIP affinity added or removed
	kinds
)

var kindNames = [kinds]string{"create", "delete", "scale", "replace", "ports", "traffic-policy", "affinity"}

func (k Kind) String() string { return kindNames[k] }

// createOrDelete is the share of the stream (percent) that creates or
// deletes; the rest updates a Service, by these weights.
const createOrDelete = 30

var updateWeights = []struct {
	kind   Kind
	weight int
}{{Scale, 20}, {Replace, 20}, {Ports, 10}, {Traffic, 10}, {Affinity, 10}}

// maxEndpoints caps a Service's endpoints.
const maxEndpoints = 5

// Port is one Service port: its number, and the pods' port it targets.
type Port struct {
	Name     string
	Protocol v1.Protocol
	Port     int32
	Target   int32
}

// Spec is a Service as the model holds it.
type Spec struct {
	NodePort  bool // type NodePort, else ClusterIP
	DualStack bool // PreferDualStack, else SingleStack
	Local     bool // externalTrafficPolicy: Local (NodePort only)
	Affinity  bool // sessionAffinity: ClientIP
	Ports     []Port
	Endpoints []int // indexes into the pods, sorted
}

func (s Spec) clone() Spec {
	s.Ports = slices.Clone(s.Ports)
	s.Endpoints = slices.Clone(s.Endpoints)
	return s
}

// Change is one change: the slot's Service after it (zero for Delete).
type Change struct {
	Kind Kind
	Slot int
	Name string
	Spec Spec
}

// Model is one stream of changes over its own slots.
type Model struct {
	prefix string
	slots  []*Spec
	names  []string // of the slots' Services
	made   int      // Services created
	pods   int
	tcp    []int32 // the pods' TCP ports
	udp    []int32 // and UDP ports
	r      *rand.Rand
}

// NewModel returns a model of n empty slots, whose Services are named
// prefix-<n> for the n-th one created, and whose endpoints are indexes into pods pods that serve the given ports.
func NewModel(prefix string, n, pods int, tcpPorts, udpPorts []int, seed uint64) *Model {
	m := &Model{prefix: prefix, slots: make([]*Spec, n), names: make([]string, n), pods: pods, r: rand.New(rand.NewPCG(seed, 0x50a4))}
	for _, p := range tcpPorts {
		m.tcp = append(m.tcp, int32(p))
	}
	for _, p := range udpPorts {
		m.udp = append(m.udp, int32(p))
	}
	return m
}

// Present counts the slots that hold a Service.
func (m *Model) Present() int {
	n := 0
	for _, s := range m.slots {
		if s != nil {
			n++
		}
	}
	return n
}

// Next picks the next change, applies it to the model and returns it.
func (m *Model) Next() Change {
	present := m.Present()
	if m.r.IntN(100) < createOrDelete || present == 0 {
		if m.r.IntN(len(m.slots)) < present {
			return m.delete()
		}
		return m.create()
	}
	i := m.pick(true)
	s := m.slots[i].clone()
	kind := m.updateKind()
	switch kind {
	case Scale:
		m.scale(&s)
	case Replace:
		if !m.replace(&s) {
			kind = Scale
			m.scale(&s)
		}
	case Ports:
		m.changePort(&s)
	case Traffic:
		if !s.NodePort {
			kind = Scale
			m.scale(&s)
		} else {
			s.Local = !s.Local
		}
	case Affinity:
		s.Affinity = !s.Affinity
	}
	m.slots[i] = &s
	return Change{Kind: kind, Slot: i, Name: m.names[i], Spec: s.clone()}
}

func (m *Model) updateKind() Kind {
	total := 0
	for _, w := range updateWeights {
		total += w.weight
	}
	n := m.r.IntN(total)
	for _, w := range updateWeights {
		if n < w.weight {
			return w.kind
		}
		n -= w.weight
	}
	panic("unreachable")
}

// pick returns a random slot that holds a Service (full) or none.
func (m *Model) pick(full bool) int {
	var is []int
	for i, s := range m.slots {
		if (s != nil) == full {
			is = append(is, i)
		}
	}
	return is[m.r.IntN(len(is))]
}

func (m *Model) delete() Change {
	i := m.pick(true)
	m.slots[i] = nil
	return Change{Kind: Delete, Slot: i, Name: m.names[i]}
}

func (m *Model) create() Change {
	i := m.pick(false)
	m.names[i] = fmt.Sprintf("%s-%d", m.prefix, m.made)
	m.made++
	s := Spec{
		NodePort:  m.r.IntN(2) == 0,
		DualStack: m.r.IntN(10) < 3,
		Affinity:  m.r.IntN(10) < 3,
	}
	s.Local = s.NodePort && m.r.IntN(2) == 0
	for p := range 1 + m.r.IntN(2) {
		proto := v1.ProtocolTCP
		if m.r.IntN(2) == 0 {
			proto = v1.ProtocolUDP
		}
		s.Ports = append(s.Ports, Port{Name: fmt.Sprintf("p%d", p), Protocol: proto})
		m.renumber(&s, p)
	}
	for range m.r.IntN(4) {
		m.addEndpoint(&s)
	}
	m.slots[i] = &s
	return Change{Kind: Create, Slot: i, Name: m.names[i], Spec: s.clone()}
}

// renumber gives port p a new number, unused by the Service's other ports
// of its protocol, and a target port the pods serve.
func (m *Model) renumber(s *Spec, p int) {
	port := &s.Ports[p]
	for {
		port.Port = 1000 + m.r.Int32N(9000)
		if !slices.ContainsFunc(s.Ports, func(q Port) bool {
			return q.Name != port.Name && q.Protocol == port.Protocol && q.Port == port.Port
		}) {
			break
		}
	}
	targets := m.tcp
	if port.Protocol == v1.ProtocolUDP {
		targets = m.udp
	}
	port.Target = targets[m.r.IntN(len(targets))]
}

func (m *Model) changePort(s *Spec) { m.renumber(s, m.r.IntN(len(s.Ports))) }

func (m *Model) scale(s *Spec) {
	switch {
	case len(s.Endpoints) == 0:
		m.addEndpoint(s)
	case len(s.Endpoints) >= min(maxEndpoints, m.pods), m.r.IntN(2) == 0:
		i := m.r.IntN(len(s.Endpoints))
		s.Endpoints = slices.Delete(s.Endpoints, i, i+1)
	default:
		m.addEndpoint(s)
	}
}

// addEndpoint adds a pod that is not an endpoint yet.
func (m *Model) addEndpoint(s *Spec) {
	p, ok := m.otherPod(s)
	if !ok {
		return
	}
	s.Endpoints = append(s.Endpoints, p)
	slices.Sort(s.Endpoints)
}

// replace swaps one endpoint for a pod that was not one: false when there
// is no endpoint, or no other pod.
func (m *Model) replace(s *Spec) bool {
	p, ok := m.otherPod(s)
	if len(s.Endpoints) == 0 || !ok {
		return false
	}
	s.Endpoints[m.r.IntN(len(s.Endpoints))] = p
	slices.Sort(s.Endpoints)
	return true
}

func (m *Model) otherPod(s *Spec) (int, bool) {
	var free []int
	for p := range m.pods {
		if !slices.Contains(s.Endpoints, p) {
			free = append(free, p)
		}
	}
	if len(free) == 0 {
		return 0, false
	}
	return free[m.r.IntN(len(free))], true
}
