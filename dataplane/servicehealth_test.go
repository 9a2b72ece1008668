package dataplane

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
	"github.com/onehop/onehop/test/nsutil"
)

// localService is a Service with externalTrafficPolicy: Local, a TCP and a
// UDP port, health-check node port hc and the given local endpoint IPs
// (on both ports, so each pod must count once).
func localService(name string, hc uint16, local ...string) *portal.Service {
	key := portal.ServiceKey{Namespace: "shop", Name: name}
	svc := &portal.Service{Key: key}
	for _, proto := range []portal.Protocol{portal.TCP, portal.UDP} {
		p := &portal.Portal{
			Key:                 portal.PortKey{Service: key, Port: "p", Protocol: proto, Family: portal.IPv4},
			Port:                80,
			NodePort:            30080,
			ExternalLocal:       true,
			HealthCheckNodePort: hc,
		}
		for _, ip := range local {
			p.LocalEndpoints = append(p.LocalEndpoints, netip.AddrPortFrom(netip.MustParseAddr(ip), 8080))
		}
		p.LocalReady = len(local)
		svc.Portals = append(svc.Portals, p)
	}
	return svc
}

func snapOf(svcs ...*portal.Service) *portal.Snapshot {
	s := &portal.Snapshot{Services: map[portal.ServiceKey]*portal.Service{}}
	for _, svc := range svcs {
		s.Services[svc.Key] = svc
		s.Dirty = append(s.Dirty, svc.Key)
	}
	return s
}

// withGone lists in snap.Dirty the Services sh serves that snap no longer
// holds, as the Tracker lists deleted Services, so that a test may pass
// snapOf the Services that remain.
func withGone(sh *ServiceHealth, snap *portal.Snapshot) *portal.Snapshot {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for k := range sh.wanted {
		if _, ok := snap.Services[k]; !ok {
			snap.Dirty = append(snap.Dirty, k)
		}
	}
	return snap
}

// hcAnswer is one answer of a health-check node port.
type hcAnswer struct {
	code   int
	header http.Header
	raw    string
	body   hcBody
}

// getIn sends GET url from inside n.
func getIn(t *testing.T, n *nsutil.NS, url string) (hcAnswer, error) {
	t.Helper()
	client := &http.Client{
		Timeout: 3 * time.Second,
		Transport: &http.Transport{
			DialContext:       n.Dial,
			DisableKeepAlives: true,
		},
	}
	resp, err := client.Get(url)
	if err != nil {
		return hcAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return hcAnswer{}, err
	}
	a := hcAnswer{code: resp.StatusCode, header: resp.Header, raw: string(b)}
	if err := json.Unmarshal(b, &a.body); err != nil {
		t.Fatalf("GET %s: body %q is not JSON: %v", url, b, err)
	}
	return a, nil
}

// update runs sh.Update inside n, so that the servers' sockets are n's.
func update(t *testing.T, n *nsutil.NS, sh *ServiceHealth, snap *portal.Snapshot) {
	t.Helper()
	if err := n.Do(func() error { sh.Update(withGone(sh, snap)); return nil }); err != nil {
		t.Fatal(err)
	}
}

type recordedEvent struct {
	svc            portal.ServiceKey
	reason, detail string
}

type eventLog struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (l *eventLog) record(svc portal.ServiceKey, reason, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, recordedEvent{svc, reason, msg})
}

func (l *eventLog) take() []recordedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

func TestServiceHealthStatusBodyAndHeaders(t *testing.T) {
	n := nsutil.New(t, "ohhc-")
	var healthy atomic.Bool
	healthy.Store(true)
	events := &eventLog{}
	sh := NewServiceHealth(nil, events.record, WithProxyHealth(healthy.Load))
	t.Cleanup(sh.Close)

	update(t, n, sh, snapOf(localService("web", 31001, "10.244.1.10", "10.244.1.11")))
	for _, url := range []string{"http://127.0.0.1:31001/healthz", "http://[::1]:31001/", "http://127.0.0.1:31001/any/path"} {
		a, err := getIn(t, n, url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		if a.code != http.StatusOK {
			t.Errorf("GET %s: status %d, want 200 (2 local endpoints, proxy healthy)", url, a.code)
		}
		for h, want := range map[string]string{
			"Content-Type":                     "application/json",
			"X-Content-Type-Options":           "nosniff",
			"X-Load-Balancing-Endpoint-Weight": "2",
		} {
			if got := a.header.Get(h); got != want {
				t.Errorf("GET %s: %s = %q, want %q", url, h, got, want)
			}
		}
		if a.body.Service.Namespace != "shop" || a.body.Service.Name != "web" || a.body.LocalEndpoints != 2 || !a.body.ServiceProxyHealthy {
			t.Errorf("GET %s: body %s, want service shop/web, 2 local endpoints, proxy healthy", url, a.raw)
		}
	}
	// The exact keys kube-proxy writes.
	a, _ := getIn(t, n, "http://127.0.0.1:31001/healthz")
	var generic map[string]any
	_ = json.Unmarshal([]byte(a.raw), &generic)
	for _, k := range []string{"service", "localEndpoints", "serviceProxyHealthy"} {
		if _, ok := generic[k]; !ok {
			t.Errorf("body %s lacks key %q", a.raw, k)
		}
	}

	// No local endpoint left: 503, weight 0.
	update(t, n, sh, snapOf(localService("web", 31001)))
	a, err := getIn(t, n, "http://127.0.0.1:31001/healthz")
	if err != nil {
		t.Fatal(err)
	}
	if a.code != http.StatusServiceUnavailable || a.body.LocalEndpoints != 0 || a.header.Get("X-Load-Balancing-Endpoint-Weight") != "0" {
		t.Errorf("without local endpoints: status %d weight %q body %s, want 503, 0, localEndpoints 0",
			a.code, a.header.Get("X-Load-Balancing-Endpoint-Weight"), a.raw)
	}

	// Endpoints back, but the proxy is unhealthy: 503, as kube-proxy.
	update(t, n, sh, snapOf(localService("web", 31001, "10.244.1.10")))
	healthy.Store(false)
	a, err = getIn(t, n, "http://127.0.0.1:31001/healthz")
	if err != nil {
		t.Fatal(err)
	}
	if a.code != http.StatusServiceUnavailable || a.body.ServiceProxyHealthy || a.body.LocalEndpoints != 1 {
		t.Errorf("unhealthy proxy: status %d body %s, want 503, serviceProxyHealthy false, localEndpoints 1", a.code, a.raw)
	}
	healthy.Store(true)

	// The Service goes: the port closes.
	update(t, n, sh, snapOf())
	if _, err := getIn(t, n, "http://127.0.0.1:31001/healthz"); err == nil {
		t.Errorf("port 31001 still answers after its Service went away")
	}
	if len(sh.Ports()) != 0 {
		t.Errorf("ports %v still served", sh.Ports())
	}
	if ev := events.take(); len(ev) != 0 {
		t.Errorf("unexpected events %v", ev)
	}
}

// TestServiceHealthEveryLocalServiceWithPort: the model gives a
// healthCheckNodePort to every LoadBalancer Service with
// externalTrafficPolicy: Local, also when none of its families has a way
// in (no node ports, no VIP-mode ingress IP); kube-proxy serves it then
// too. A Service without one is not served.
func TestServiceHealthEveryLocalServiceWithPort(t *testing.T) {
	noWayIn := localService("nowayin", 31002, "10.244.1.10")
	for _, p := range noWayIn.Portals {
		p.NodePort, p.ExternalLocal, p.LocalEndpoints = 0, false, nil
	}
	noPort := localService("noport", 0, "10.244.1.10")
	local := localService("local", 31003, "10.244.1.10")
	sh := NewServiceHealth(nil, nil, WithHealthListener(func(context.Context, uint16) (net.Listener, error) {
		return net.Listen("tcp", "127.0.0.1:0")
	}))
	defer sh.Close()
	sh.Update(withGone(sh, snapOf(noWayIn, noPort, local)))
	if got := sh.Ports(); !slices.Equal(got, []uint16{31002, 31003}) {
		t.Errorf("served ports %v, want [31002 31003]", got)
	}
}

func TestServiceHealthPortBusyThenRetried(t *testing.T) {
	n := nsutil.New(t, "ohhc-")
	events := &eventLog{}
	sh := NewServiceHealth(nil, events.record)
	t.Cleanup(sh.Close)

	var squatter net.Listener
	if err := n.Do(func() (err error) { squatter, err = net.Listen("tcp", ":31004"); return err }); err != nil {
		t.Fatal(err)
	}
	svc := localService("busy", 31004, "10.244.1.10")
	update(t, n, sh, snapOf(svc))
	ev := events.take()
	if len(ev) != 1 || ev[0].svc != svc.Key || ev[0].reason != ReasonHealthCheckFailed || !strings.Contains(ev[0].detail, "31004") {
		t.Fatalf("events %+v, want one %s on shop/busy naming port 31004", ev, ReasonHealthCheckFailed)
	}
	t.Logf("event while the port was taken: %s: %s", ev[0].reason, ev[0].detail)
	if len(sh.Ports()) != 0 {
		t.Errorf("ports %v served although the bind failed", sh.Ports())
	}
	// The retry at the next sync fails the same way: no second event.
	update(t, n, sh, snapOf(svc))
	if ev := events.take(); len(ev) != 0 {
		t.Errorf("the same failure reported again at the retry: %+v", ev)
	}

	squatter.Close()
	update(t, n, sh, snapOf(svc))
	if ev := events.take(); len(ev) != 0 {
		t.Errorf("events after the port was freed: %+v", ev)
	}
	a, err := getIn(t, n, "http://127.0.0.1:31004/healthz")
	if err != nil {
		t.Fatalf("port not served after the retry: %v", err)
	}
	if a.code != http.StatusOK || a.body.Service.Name != "busy" {
		t.Errorf("after retry: status %d body %s", a.code, a.raw)
	}
}

func TestServiceHealthPortMovesAndClose(t *testing.T) {
	n := nsutil.New(t, "ohhc-")
	sh := NewServiceHealth(nil, nil)
	update(t, n, sh, snapOf(localService("a", 31005, "10.244.1.10"), localService("b", 31006)))
	for port, code := range map[string]int{"31005": 200, "31006": 503} {
		a, err := getIn(t, n, "http://127.0.0.1:"+port+"/healthz")
		if err != nil || a.code != code {
			t.Fatalf("port %s: %v status %d, want %d", port, err, a.code, code)
		}
	}
	// a's health-check port changes: the old port closes, the new one answers.
	update(t, n, sh, snapOf(localService("a", 31007, "10.244.1.10"), localService("b", 31006)))
	if _, err := getIn(t, n, "http://127.0.0.1:31005/healthz"); err == nil {
		t.Errorf("old port 31005 still answers")
	}
	if a, err := getIn(t, n, "http://127.0.0.1:31007/healthz"); err != nil || a.body.Service.Name != "a" {
		t.Errorf("new port 31007: %v %+v", err, a.body)
	}
	// The port passes to another Service.
	update(t, n, sh, snapOf(localService("c", 31007, "10.244.1.10", "10.244.1.11")))
	if a, err := getIn(t, n, "http://127.0.0.1:31007/healthz"); err != nil || a.body.Service.Name != "c" || a.body.LocalEndpoints != 2 {
		t.Errorf("port 31007 after it passed to c: %v %s", err, a.raw)
	}
	sh.Close()
	for _, port := range []string{"31006", "31007"} {
		if _, err := getIn(t, n, "http://127.0.0.1:"+port+"/healthz"); err == nil {
			t.Errorf("port %s answers after Close", port)
		}
	}
	update(t, n, sh, snapOf(localService("a", 31005, "10.244.1.10")))
	if len(sh.Ports()) != 0 {
		t.Errorf("Update after Close started %v", sh.Ports())
	}
}

func TestServiceHealthClashEvent(t *testing.T) {
	events := &eventLog{}
	sh := NewServiceHealth(nil, events.record, WithHealthListener(func(context.Context, uint16) (net.Listener, error) {
		return net.Listen("tcp", "127.0.0.1:0")
	}))
	defer sh.Close()
	snap := snapOf(localService("a", 31008, "10.244.1.10"), localService("b", 31008))
	sh.Update(withGone(sh, snap))
	ev := events.take()
	if len(ev) != 1 || ev[0].svc.Name != "b" || !strings.Contains(ev[0].detail, "shop/a") {
		t.Errorf("events %+v, want one on shop/b naming shop/a (a sorts first and keeps the port)", ev)
	}
	sh.Update(withGone(sh, snap))
	if ev := events.take(); len(ev) != 0 {
		t.Errorf("the same clash reported again: %+v", ev)
	}
	// Once the clash is gone and comes back, it is reported again.
	sh.Update(withGone(sh, snapOf(localService("a", 31008, "10.244.1.10"))))
	sh.Update(withGone(sh, snap))
	if ev := events.take(); len(ev) != 1 {
		t.Errorf("events %+v after the clash came back, want one", ev)
	}
}

func TestProxyHealthyFollowsQueuedUpdates(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	h := NewHealthServer("127.0.0.1:0", 10*time.Second, clock.Now)
	if !h.ProxyHealthy() {
		t.Fatal("unhealthy before anything was queued")
	}
	h.QueuedUpdate()
	clock.Advance(19 * time.Second)
	if !h.ProxyHealthy() {
		t.Error("unhealthy within 2x the sync period")
	}
	clock.Advance(2 * time.Second)
	if h.ProxyHealthy() {
		t.Error("healthy although a queued update waited more than 2x the sync period")
	}
	h.Updated()
	if !h.ProxyHealthy() {
		t.Error("unhealthy after a successful sync")
	}
	// Node eligibility is not the proxy's health.
	h.SyncNode(true, true)
	if !h.ProxyHealthy() {
		t.Error("a deleting, tainted node made the proxy unhealthy")
	}
}

// Update looks at the snapshot's Dirty Services only (after the first,
// taken whole): a sync costs what changed, not a walk of every Service.
func TestServiceHealthFollowsDirty(t *testing.T) {
	listen := func(ctx context.Context, _ uint16) (net.Listener, error) {
		var lc net.ListenConfig
		return lc.Listen(ctx, "tcp", "127.0.0.1:0")
	}
	sh := NewServiceHealth(slog.New(slog.NewTextHandler(io.Discard, nil)), nil, WithHealthListener(listen))
	defer sh.Close()
	ports := func() []uint16 {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return slices.Sorted(maps.Keys(sh.servers))
	}
	sh.Update(snapOf(localService("a", 31001, "10.244.1.10")))
	if got := ports(); !slices.Equal(got, []uint16{31001}) {
		t.Fatalf("first snapshot: serving %v, want [31001]", got)
	}
	moved := snapOf(localService("a", 31002, "10.244.1.10"))
	dirty := moved.Dirty
	moved.Dirty = nil
	sh.Update(moved)
	if got := ports(); !slices.Equal(got, []uint16{31001}) {
		t.Errorf("a change not listed in Dirty was looked at: serving %v", got)
	}
	moved.Dirty = dirty
	sh.Update(moved)
	if got := ports(); !slices.Equal(got, []uint16{31002}) {
		t.Errorf("after the change is listed: serving %v, want [31002]", got)
	}
}
