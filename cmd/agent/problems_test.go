package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/onehop/onehop/portal"
)

// TestControllerTellsAProblemOnce: in a split install `agent controller`
// puts a Service's problem on it (here an externalIP outside
// externalIPCIDRs), under deploy/base's RBAC, and only once although the
// Service's endpoints keep changing for a while; the node agents only log
// it (separateController), so the count does not grow with the nodes.
func TestControllerTellsAProblemOnce(t *testing.T) {
	admin, conf := controllerSetup(t, "onehop-controller-problems", "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if !separateController([]byte(`{"separateController":true}`)) || separateController(nil) {
		t.Fatal("separateController does not read the external section")
	}
	var logs lockedBuffer
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- controllerCmd(runCtx, []string{"--config", conf, "--identity", "ctl-p", "--healthz-bind-address", ""}, &logs)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("agent controller: %v", err)
		}
		if strings.Contains(strings.ToLower(logs.String()), "forbidden") {
			t.Errorf("the controller was refused a request:\n%s", logs.String())
		}
	})

	if _, err := admin.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, ExternalIPs: []string{"198.51.100.7"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-x", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	// The endpoints change every 100 ms for 6 s: each change rebuilds the
	// Service in the controller's model.
	for i := range 60 {
		slice.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.244.1.%d", i%250+1)}}}
		var err error
		if i == 0 {
			slice, err = admin.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{})
		} else {
			slice, err = admin.DiscoveryV1().EndpointSlices("default").Update(ctx, slice, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * problemsEvery) // the last changes are looked at
	evs, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "web").String()})
	if err != nil {
		t.Fatal(err)
	}
	var told []string
	total := int32(0)
	for _, e := range evs.Items {
		if e.Reason == portal.ReasonExternalIPRefused {
			told = append(told, fmt.Sprintf("%s x%d from %s: %s", e.Name, e.Count, e.Source.Component, e.Message))
			total += max(e.Count, 1)
		}
	}
	if total != 1 {
		t.Fatalf("%s told %d times, want once: %v\ncontroller log:\n%s", portal.ReasonExternalIPRefused, total, told, logs.String())
	}
	t.Logf("told once: %s", told[0])
}
