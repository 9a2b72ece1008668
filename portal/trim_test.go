package portal

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTrimForCache: managed fields and kubectl's last-applied copy go, the
// annotations the model reads stay; TrimManagedFields keeps the copy.
func TestTrimForCache(t *testing.T) {
	mk := func() *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
			Annotations:   map[string]string{lastApplied: `{"kind":"Service"}`, v1.AnnotationTopologyMode: "Auto"}}}
	}
	got, err := TrimForCache(mk())
	if err != nil {
		t.Fatal(err)
	}
	s := got.(*v1.Service)
	if s.ManagedFields != nil || s.Annotations[lastApplied] != "" || s.Annotations[v1.AnnotationTopologyMode] != "Auto" {
		t.Errorf("TrimForCache left %+v", s.ObjectMeta)
	}
	got, _ = TrimManagedFields(mk())
	if s := got.(*v1.Service); s.ManagedFields != nil || s.Annotations[lastApplied] == "" {
		t.Errorf("TrimManagedFields left %+v", s.ObjectMeta)
	}
	if got, err := TrimForCache("not an object"); err != nil || got != "not an object" {
		t.Errorf("an unknown object: %v, %v", got, err)
	}
}
