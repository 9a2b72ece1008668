package main

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/onehop/onehop/dataplane"
	"github.com/onehop/onehop/portal"
)

func TestTraceComparesWithTheAPIServer(t *testing.T) {
	web := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10"}, ExternalIPs: []string{"203.0.113.10"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1"},
		Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.244.1.2"}, {IP: "fd00:244:0:1::2"}}}}
	client := fake.NewClientset(web, pod)
	ctx := context.Background()
	match := func(svc, kind string) *dataplane.Trace {
		return &dataplane.Trace{Match: &dataplane.TraceMatch{Service: svc, Kind: kind}}
	}
	q := func(to string) dataplane.TraceQuery {
		return dataplane.TraceQuery{To: netip.MustParseAddrPort(to), Protocol: "tcp"}
	}
	for _, c := range []struct {
		name  string
		trace *dataplane.Trace
		q     dataplane.TraceQuery
		want  string // empty: they agree
	}{
		{"programmed and in the API server", match("default/web:http/tcp/ipv4", "cluster-ip"), q("10.96.0.10:80"), ""},
		{"node port of the Service", match("default/web:http/tcp/ipv4", "node-port"), q("198.51.100.1:30080"), ""},
		{"external IP of the Service", match("default/web:http/tcp/ipv4", "external-ip"), q("203.0.113.10:80"), ""},
		{"not programmed", &dataplane.Trace{}, q("10.96.0.10:80"), "the kernel does not program it"},
		{"programmed, Service gone", match("default/old:http/tcp/ipv4", "cluster-ip"), q("10.96.0.20:80"), "has no such Service"},
		{"programmed, port gone", match("default/web:http/tcp/ipv4", "cluster-ip"), q("10.96.0.10:81"), "has no such way in"},
		{"neither", &dataplane.Trace{}, q("10.96.0.99:80"), ""},
	} {
		d, err := compareAPIServer(ctx, client, c.trace, c.q)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		switch {
		case c.want == "" && len(d) != 0:
			t.Errorf("%s: want agreement, got %+v", c.name, d)
		case c.want != "" && (len(d) != 1 || !strings.Contains(d[0].Problem, c.want)):
			t.Errorf("%s: want one disagreement saying %q, got %+v", c.name, c.want, d)
		}
	}
	for _, c := range []struct {
		v4   bool
		want string
	}{{true, "10.244.1.2"}, {false, "fd00:244:0:1::2"}} {
		a, err := podAddr(ctx, client, portal.ServiceKey{Namespace: "default", Name: "web-1"}, c.v4)
		if err != nil || a.String() != c.want {
			t.Errorf("pod address (IPv4 %v): %s %v, want %s", c.v4, a, err, c.want)
		}
	}
	if _, err := podAddr(ctx, client, portal.ServiceKey{Namespace: "default", Name: "gone"}, true); err == nil || !strings.Contains(err.Error(), "--from-pod default/gone") {
		t.Errorf("a missing pod: %v", err)
	}
}
