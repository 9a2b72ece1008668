package hooktest

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/dataplane"
)

// Gauge returns the value of the series of name with the labels' values
// in reg, and whether it exists.
func Gauge(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// GatherSeries is reg's series whose names begin with prefix, each as its
// name, then "/" and its one label's value if it has one, to its value.
func GatherSeries(t *testing.T, reg *prometheus.Registry, prefix string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, mt := range mf.GetMetric() {
			name := mf.GetName()
			if l := mt.GetLabel(); len(l) > 0 {
				name += "/" + l[0].GetValue()
			}
			out[name] = mt.GetGauge().GetValue() + mt.GetCounter().GetValue()
		}
	}
	return out
}

// ProviderDetail is /healthz's providerFailures.
func ProviderDetail(t *testing.T, hs *dataplane.HealthServer) map[string]string {
	t.Helper()
	w := httptest.NewRecorder()
	hs.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
	var body struct {
		ProviderFailures map[string]string `json:"providerFailures"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("/healthz %q: %v", w.Body.String(), err)
	}
	return body.ProviderFailures
}
