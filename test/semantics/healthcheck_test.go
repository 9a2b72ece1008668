package semantics_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// healthAnswer is one answer of a health-check node port.
type healthAnswer struct {
	code   int
	header http.Header
	raw    string
	body   struct {
		Service struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
		LocalEndpoints      int  `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}
}

func getHealth(c *netns.Cluster, n *netns.Node, hc int32) (healthAnswer, error) {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{DialContext: nsutil.Dialer(c.ClientNetns), DisableKeepAlives: true},
	}
	resp, err := client.Get(fmt.Sprintf("http://%s/healthz", hostPort(n.IP, hc)))
	if err != nil {
		return healthAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return healthAnswer{}, err
	}
	a := healthAnswer{code: resp.StatusCode, header: resp.Header, raw: string(b)}
	if err := json.Unmarshal(b, &a.body); err != nil {
		return a, fmt.Errorf("body %q: %w", b, err)
	}
	return a, nil
}

// waitHealth polls node n's health-check node port from the external
// client until it answers code with local endpoints count.
func waitHealth(t *testing.T, c *netns.Cluster, n *netns.Node, hc int32, code, count int, since time.Time) healthAnswer {
	t.Helper()
	deadline := time.Now().Add(netns.ConvergeTimeout)
	var last string
	for time.Now().Before(deadline) {
		a, err := getHealth(c, n, hc)
		if err == nil && a.code == code && a.body.LocalEndpoints == count {
			logLatency(t, fmt.Sprintf("health check %s:%d answers %d with %d local endpoints", n.Name, hc, code, count), time.Since(since))
			return a
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", a.code, a.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("health check node port %d on %s: want %d with localEndpoints %d within %v; last: %s", hc, n.Name, code, count, netns.ConvergeTimeout, last)
	return healthAnswer{}
}

func checkHealthAnswer(t *testing.T, a healthAnswer, svc *v1.Service, count int) {
	t.Helper()
	if a.body.Service.Namespace != svc.Namespace || a.body.Service.Name != svc.Name || !a.body.ServiceProxyHealthy {
		t.Errorf("health check body %s: want service %s/%s and serviceProxyHealthy true", a.raw, svc.Namespace, svc.Name)
	}
	for h, want := range map[string]string{
		"Content-Type":                     "application/json",
		"X-Content-Type-Options":           "nosniff",
		"X-Load-Balancing-Endpoint-Weight": fmt.Sprint(count),
	} {
		if got := a.header.Get(h); got != want {
			t.Errorf("health check header %s = %q, want %q", h, got, want)
		}
	}
}

func waitHealthGone(t *testing.T, c *netns.Cluster, n *netns.Node, hc int32) {
	t.Helper()
	began := time.Now()
	for time.Since(began) < netns.ConvergeTimeout {
		if _, err := getHealth(c, n, hc); err != nil {
			logLatency(t, fmt.Sprintf("health check port %d on %s closed after the Service went back to Cluster", hc, n.Name), time.Since(began))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("health check port %d on %s still answers %v after the Service went back to Cluster", hc, n.Name, netns.ConvergeTimeout)
}

// A health-check node port that cannot be bound (something on the node holds
// it) gives a Warning event on the Service; once the port is free, the next
// sync serves it.
func testHealthCheckPortBusy(t *testing.T, c *netns.Cluster) {
	ctx := ctxFor(t)
	node1 := c.Nodes[0]
	const hc = 32123
	squatter, err := nsutil.Listen(node1.Netns, "tcp", fmt.Sprintf(":%d", hc))
	if err != nil {
		t.Fatalf("hold port %d on %s: %v", hc, node1.Name, err)
	}
	defer squatter.Close()

	s := service("squatted", v1.ServiceTypeLoadBalancer, port("http", v1.ProtocolTCP, 80, netns.PortHTTP))
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = hc
	svc, since := expose(t, c, s, netns.Ready(node1.Pods...))
	if svc.Spec.HealthCheckNodePort != hc {
		t.Fatalf("healthCheckNodePort %d, asked for %d", svc.Spec.HealthCheckNodePort, hc)
	}

	var found *v1.Event
	for found == nil && time.Since(since) < netns.ConvergeTimeout {
		evs, err := c.Client.CoreV1().Events(svc.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Service,involvedObject.name=" + svc.Name,
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range evs.Items {
			if e.Reason == "FailedToStartServiceHealthcheck" && e.Type == v1.EventTypeWarning {
				found = &evs.Items[i]
			}
		}
		if found == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if found == nil {
		t.Fatalf("no Warning FailedToStartServiceHealthcheck event on service %s within %v while %s held port %d",
			svc.Name, netns.ConvergeTimeout, node1.Name, hc)
	}
	logLatency(t, "event on the Service", time.Since(since))
	t.Logf("event: %s %s (source %s): %s", found.Type, found.Reason, found.Source.Host, found.Message)
	if found.Source.Host != node1.Name || !strings.Contains(found.Message, fmt.Sprint(hc)) {
		t.Errorf("event from %q with message %q: want it from %s naming port %d", found.Source.Host, found.Message, node1.Name, hc)
	}
	if found.InvolvedObject.UID != svc.UID {
		t.Logf("note: the event's involvedObject has UID %q, the Service %q: `kubectl describe service` lists events by UID", found.InvolvedObject.UID, svc.UID)
	}

	// Free the port; any later sync (here: an endpoint change) serves it.
	squatter.Close()
	freed := time.Now()
	if err := c.SetEndpoints(ctx, svc, netns.Ready(node1.Pods[0])); err != nil {
		t.Fatal(err)
	}
	checkHealthAnswer(t, waitHealth(t, c, node1, hc, http.StatusOK, 1, freed), svc, 1)
}
