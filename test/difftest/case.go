package difftest

import (
	"encoding/json"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// namespace holds every object of a case.
const namespace = metav1.NamespaceDefault

// managedBy is the EndpointSlice controller's managed-by label value: the
// test writes slices as that controller would.
const managedBy = "endpointslice-controller.k8s.io"

// Case is what both twins are given: Services, each with its endpoints.
// Every address and port is chosen by the generator (cluster IPs and
// NodePorts included), so that both API servers hold the same objects.
type Case struct {
	Seed     uint64
	Services []*ServiceCase
}

// ServiceCase is one Service, the load balancer's status the test writes
// for it, and the endpoints its EndpointSlices list.
type ServiceCase struct {
	Service   *v1.Service
	Ingress   []string // status.loadBalancer.ingress IPs
	Endpoints []Endpoint
	// Split puts Endpoints[Split:] in a second slice (0: one slice).
	// Duplicate lists Endpoints[0] in that second slice too.
	Split     int
	Duplicate bool
}

// Endpoint is one pod of the plan in a Service's EndpointSlice, with its
// conditions as written (nil: left unset, which means true for ready and
// serving, false for terminating).
type Endpoint struct {
	Pod         podRef
	Ready       *bool
	Serving     *bool
	Terminating *bool
}

// clone returns a deep copy of c, for shrinking.
func (c *Case) clone() *Case {
	out := &Case{Seed: c.Seed}
	for _, s := range c.Services {
		out.Services = append(out.Services, &ServiceCase{
			Service:   s.Service.DeepCopy(),
			Ingress:   append([]string(nil), s.Ingress...),
			Endpoints: append([]Endpoint(nil), s.Endpoints...),
			Split:     s.Split,
			Duplicate: s.Duplicate,
		})
	}
	return out
}

// service returns the case's Service named name, or nil.
func (c *Case) service(name string) *ServiceCase {
	for _, s := range c.Services {
		if s.Service.Name == name {
			return s
		}
	}
	return nil
}

// slices returns the EndpointSlices the EndpointSlice controller would
// write for s: one set per IP family of the Service (IPv4 when it names
// none), target ports resolved to numbers, each endpoint with its pod's
// address of that family, its node, zone, hints and a Pod reference; the
// Service's labels copied but for the headless one, set only on a
// headless Service's slices. The endpoints fill one slice per family, or
// two when the case splits them (Split), the first endpoint then in both
// when it is a duplicate.
func (s *ServiceCase) slices() []*discoveryv1.EndpointSlice {
	groups := [][]Endpoint{s.Endpoints}
	if s.Split > 0 && s.Split < len(s.Endpoints) {
		second := s.Endpoints[s.Split:]
		if s.Duplicate {
			second = append([]Endpoint{s.Endpoints[0]}, second...)
		}
		groups = [][]Endpoint{s.Endpoints[:s.Split], second}
	}
	var out []*discoveryv1.EndpointSlice
	for _, f := range s.families() {
		for i, eps := range groups {
			out = append(out, s.slice(sliceName(s.Service.Name, f, i), f, eps))
		}
	}
	return out
}

// families returns the Service's IP families, IPv4 when it names none.
func (s *ServiceCase) families() []v1.IPFamily {
	if fs := s.Service.Spec.IPFamilies; len(fs) > 0 {
		return fs
	}
	return []v1.IPFamily{v1.IPv4Protocol}
}

// sliceName names the i-th (0-based) EndpointSlice of family f of the
// Service named service: "<service>-ipv4", "<service>-ipv6-2".
func sliceName(service string, f v1.IPFamily, i int) string {
	name := service + "-" + strings.ToLower(string(f))
	if i > 0 {
		name += fmt.Sprintf("-%d", i+1)
	}
	return name
}

func (s *ServiceCase) slice(name string, f v1.IPFamily, eps []Endpoint) *discoveryv1.EndpointSlice {
	slice := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{}},
		AddressType: discoveryv1.AddressType(f),
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for k, v := range s.Service.Labels {
		slice.Labels[k] = v
	}
	delete(slice.Labels, labelHeadless)
	if s.Service.Spec.ClusterIP == v1.ClusterIPNone {
		slice.Labels[labelHeadless] = ""
	}
	slice.Labels[discoveryv1.LabelServiceName] = s.Service.Name
	slice.Labels[discoveryv1.LabelManagedBy] = managedBy
	for _, p := range s.Service.Spec.Ports {
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{
			Name:     ptr.To(p.Name),
			Protocol: ptr.To(p.Protocol),
			Port:     ptr.To(int32(p.TargetPort.IntValue())),
		})
	}
	for _, e := range eps {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.Pod.IPOf(f).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: e.Ready, Serving: e.Serving, Terminating: e.Terminating},
			NodeName:   ptr.To(nodeName(e.Pod.Node)),
			Zone:       ptr.To(nodeZone(e.Pod.Node)),
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: e.Pod.Name()},
			Hints:      s.hints(e),
		})
	}
	return slice
}

// hints are what the EndpointSlice controller writes for a Service with a
// trafficDistribution, on ready endpoints: the endpoint's own zone, and
// for PreferSameNode its own node too.
func (s *ServiceCase) hints(e Endpoint) *discoveryv1.EndpointHints {
	td := s.Service.Spec.TrafficDistribution
	if td == nil || e.Ready == nil || !*e.Ready {
		return nil
	}
	p := e.Pod
	h := &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: nodeZone(p.Node)}}}
	if *td == v1.ServiceTrafficDistributionPreferSameNode {
		h.ForNodes = []discoveryv1.ForNode{{Name: nodeName(p.Node)}}
	}
	return h
}

// YAML prints the case as the objects the test writes, ready to become a
// regression test.
func (c *Case) YAML() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# case seed %d\n", c.Seed)
	for _, s := range c.Services {
		svc := s.Service.DeepCopy()
		for _, ip := range s.Ingress {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
		}
		writeYAML(&b, svc)
		for _, sl := range s.slices() {
			writeYAML(&b, sl)
		}
	}
	return b.String()
}

func writeYAML(b *strings.Builder, obj any) {
	// Through JSON to a map, to leave out what the test never sets.
	var m map[string]any
	j, err := json.Marshal(obj)
	if err == nil {
		err = json.Unmarshal(j, &m)
	}
	if err != nil {
		fmt.Fprintf(b, "# cannot print: %v\n", err)
		return
	}
	if meta, ok := m["metadata"].(map[string]any); ok {
		delete(meta, "creationTimestamp")
	}
	if st, ok := m["status"].(map[string]any); ok {
		if lb, ok := st["loadBalancer"].(map[string]any); ok && len(lb) == 0 {
			delete(m, "status")
		}
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		fmt.Fprintf(b, "# cannot print: %v\n", err)
		return
	}
	b.WriteString("---\n")
	b.Write(out)
}
