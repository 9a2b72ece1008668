package difftest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// regressionDir holds the regression cases: each difference fixed keeps
// its minimal case there, as the YAML a failing run printed (Case.YAML),
// under comment lines that say what differed. Every run replays them
// through both twins before the random seeds (regress_test.go).
const regressionDir = "testdata/regressions"

// regression is one case of regressionDir.
type regression struct {
	Name string // the file's name without .yaml
	Case *Case
}

// loadRegressions reads every case of dir, in the order of their names.
func loadRegressions(dir string) ([]regression, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []regression
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		c, err := parseCase(string(text))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, regression{Name: strings.TrimSuffix(filepath.Base(f), ".yaml"), Case: c})
	}
	return out, nil
}

var (
	seedLine     = regexp.MustCompile(`(?m)^# case seed (\d+)$`)
	yamlDocStart = regexp.MustCompile(`(?m)^---[ \t]*$`)
)

// parseCase reads back a case from the objects Case.YAML prints: each
// Service with its load balancer's status, and the EndpointSlices of the
// Service's first IP family (those of another family list the same pods).
// A second slice of that family is the case's split, its first endpoint a
// duplicate when the first slice begins with the same pod. Comment lines
// are ignored, but for "# case seed N". Unknown fields are an error, so
// that a case never says more than what is replayed.
func parseCase(text string) (*Case, error) {
	c := &Case{}
	if m := seedLine.FindStringSubmatch(text); m != nil {
		seed, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		c.Seed = seed
	}
	slices := map[string]*discoveryv1.EndpointSlice{}
	for i, doc := range yamlDocuments(text) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("object %d: %w", i+1, err)
		}
		switch tm.Kind {
		case "Service":
			svc := &v1.Service{}
			if err := yaml.UnmarshalStrict([]byte(doc), svc); err != nil {
				return nil, fmt.Errorf("object %d: %w", i+1, err)
			}
			s := &ServiceCase{Service: svc}
			for _, in := range svc.Status.LoadBalancer.Ingress {
				s.Ingress = append(s.Ingress, in.IP)
			}
			svc.Status = v1.ServiceStatus{}
			c.Services = append(c.Services, s)
		case "EndpointSlice":
			sl := &discoveryv1.EndpointSlice{}
			if err := yaml.UnmarshalStrict([]byte(doc), sl); err != nil {
				return nil, fmt.Errorf("object %d: %w", i+1, err)
			}
			slices[sl.Name] = sl
		default:
			return nil, fmt.Errorf("object %d: kind %q: want a Service or an EndpointSlice", i+1, tm.Kind)
		}
	}
	if len(c.Services) == 0 {
		return nil, fmt.Errorf("no Service")
	}
	for _, s := range c.Services {
		f := s.families()[0]
		first := slices[sliceName(s.Service.Name, f, 0)]
		if first == nil {
			return nil, fmt.Errorf("service %s: no EndpointSlice %s", s.Service.Name, sliceName(s.Service.Name, f, 0))
		}
		eps, err := caseEndpoints(first)
		if err != nil {
			return nil, err
		}
		s.Endpoints = eps
		second := slices[sliceName(s.Service.Name, f, 1)]
		if second == nil {
			continue
		}
		more, err := caseEndpoints(second)
		if err != nil {
			return nil, err
		}
		s.Split = len(eps)
		if len(eps) > 0 && len(more) > 0 && more[0].Pod == eps[0].Pod {
			s.Duplicate, more = true, more[1:]
		}
		s.Endpoints = append(s.Endpoints, more...)
	}
	return c, nil
}

// yamlDocuments splits text at its "---" lines and drops the documents
// that hold nothing but comments.
func yamlDocuments(text string) []string {
	var out []string
	for _, doc := range yamlDocStart.Split(text, -1) {
		for _, l := range strings.Split(doc, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				out = append(out, doc)
				break
			}
		}
	}
	return out
}

// caseEndpoints returns the endpoints of sl as the case lists them: the
// pod its target reference names, and its conditions as written.
func caseEndpoints(sl *discoveryv1.EndpointSlice) ([]Endpoint, error) {
	var out []Endpoint
	for _, e := range sl.Endpoints {
		if e.TargetRef == nil {
			return nil, fmt.Errorf("EndpointSlice %s: an endpoint without a Pod reference", sl.Name)
		}
		p, err := parsePodRef(e.TargetRef.Name)
		if err != nil {
			return nil, fmt.Errorf("EndpointSlice %s: %w", sl.Name, err)
		}
		c := e.Conditions
		out = append(out, Endpoint{Pod: p, Ready: c.Ready, Serving: c.Serving, Terminating: c.Terminating})
	}
	return out, nil
}

// parsePodRef is the inverse of podRef.Name, for the pods of the plan.
func parsePodRef(name string) (podRef, error) {
	var p podRef
	if _, err := fmt.Sscanf(name, "pod-%d-%d", &p.Node, &p.Index); err != nil || p.Name() != name ||
		p.Node < 1 || p.Node > nodes || p.Index < 1 || p.Index > podsPerNode {
		return podRef{}, fmt.Errorf("pod %q is not one of the plan's", name)
	}
	return p, nil
}
