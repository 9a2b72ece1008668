package dataplane

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeClock is a settable clock for the health server's deadlines.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// serveLoopback runs serve on a fresh loopback listener until the test
// ends and returns the base URL.
func serveLoopback(t *testing.T, serve func(context.Context, net.Listener) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server after cancel: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// startHealth serves h on loopback until the test ends.
func startHealth(t *testing.T, h *HealthServer) string {
	return serveLoopback(t, h.Serve)
}

type healthAnswer struct {
	code int
	body map[string]any
}

func getHealth(t *testing.T, url string) healthAnswer {
	t.Helper()
	code, hdr, raw := fetch(t, url)
	if got := hdr.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("%s: X-Content-Type-Options = %q, want nosniff", url, got)
	}
	if got := hdr.Get("Content-Type"); got != "application/json" {
		t.Errorf("%s: Content-Type = %q, want application/json", url, got)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(raw), &body); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", url, raw, err)
	}
	return healthAnswer{code: code, body: body}
}

// fetch GETs url and returns the status, headers and body.
func fetch(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestHealthTransitions(t *testing.T) {
	const period = 30 * time.Second
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := &fakeClock{t: start}
	h := NewHealthServer("unused", period, clock.Now)
	base := startHealth(t, h)

	ts := func(tm time.Time) string { return tm.Format(time.RFC3339Nano) }
	type want struct {
		livez, healthz int
		eligible       bool
		lastUpdated    time.Time // in /livez's body
	}
	check := func(step string, w want) {
		t.Helper()
		now := clock.Now()
		l := getHealth(t, base+"/livez")
		hz := getHealth(t, base+"/healthz")
		if l.code != w.livez || hz.code != w.healthz {
			t.Errorf("%s: /livez %d /healthz %d, want %d %d", step, l.code, hz.code, w.livez, w.healthz)
		}
		if _, ok := l.body["nodeEligible"]; ok {
			t.Errorf("%s: /livez reports nodeEligible: %v", step, l.body)
		}
		if got := hz.body["nodeEligible"]; got != w.eligible {
			t.Errorf("%s: /healthz nodeEligible = %v, want %v", step, got, w.eligible)
		}
		for name, a := range map[string]healthAnswer{"/livez": l, "/healthz": hz} {
			if got := a.body["currentTime"]; got != ts(now) {
				t.Errorf("%s: %s currentTime = %v, want %s", step, name, got, ts(now))
			}
		}
		if got := l.body["lastUpdated"]; got != ts(w.lastUpdated) {
			t.Errorf("%s: /livez lastUpdated = %v, want %s", step, got, ts(w.lastUpdated))
		}
		if got := l.body["healthy"]; got != (w.livez == 200) {
			t.Errorf("%s: /livez healthy = %v with code %d", step, got, w.livez)
		}
	}

	// Starting up: nothing queued, so alive; the node is not known yet.
	check("start", want{livez: 200, healthz: 503, eligible: false, lastUpdated: clock.Now()})

	h.SyncNode(false, false)
	check("node known", want{livez: 200, healthz: 200, eligible: true, lastUpdated: clock.Now()})

	h.Updated()
	synced := clock.Now()
	clock.Advance(time.Hour) // idle for long: nothing queued, still healthy
	check("idle", want{livez: 200, healthz: 200, eligible: true, lastUpdated: clock.Now()})

	h.QueuedUpdate()
	clock.Advance(2*period - time.Nanosecond)
	check("queued, not late", want{livez: 200, healthz: 200, eligible: true, lastUpdated: clock.Now()})

	h.QueuedUpdate() // a later change must not move the deadline of the first
	clock.Advance(time.Nanosecond)
	check("queued, late", want{livez: 503, healthz: 503, eligible: true, lastUpdated: synced})

	h.Updated()
	check("applied", want{livez: 200, healthz: 200, eligible: true, lastUpdated: clock.Now()})

	h.SyncNode(false, true)
	check("tainted", want{livez: 200, healthz: 503, eligible: false, lastUpdated: clock.Now()})

	h.SyncNode(true, false)
	check("deleting", want{livez: 200, healthz: 503, eligible: false, lastUpdated: clock.Now()})

	h.SyncNode(false, false)
	check("eligible again", want{livez: 200, healthz: 200, eligible: true, lastUpdated: clock.Now()})
}

// A queued update that is never applied makes the agent unhealthy even
// when no sync ever succeeded (stuck before the first sync).
func TestHealthQueuedBeforeFirstSync(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	h := NewHealthServer("unused", time.Second, clock.Now)
	h.SyncNode(false, false)
	base := startHealth(t, h)

	h.QueuedUpdate()
	clock.Advance(2 * time.Second)
	if a := getHealth(t, base+"/livez"); a.code != http.StatusServiceUnavailable {
		t.Errorf("/livez = %d, want 503", a.code)
	}
	if a := getHealth(t, base+"/healthz"); a.code != http.StatusServiceUnavailable || a.body["healthy"] != false {
		t.Errorf("/healthz = %d %v, want 503 and healthy false", a.code, a.body)
	}
}

func TestHealthCountsAnswers(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	h := NewHealthServer("unused", time.Second, clock.Now)
	h.SetMetrics(m)
	base := startHealth(t, h)

	getHealth(t, base+"/healthz") // node unknown: 503
	h.SyncNode(false, false)
	getHealth(t, base+"/healthz")
	getHealth(t, base+"/livez")
	h.QueuedUpdate()

	for _, c := range []struct {
		vec  *prometheus.CounterVec
		code string
		want float64
	}{
		{m.healthz, "503", 1}, {m.healthz, "200", 1}, {m.livez, "200", 1}, {m.livez, "503", 0},
	} {
		if got := testutil.ToFloat64(c.vec.WithLabelValues(c.code)); got != c.want {
			t.Errorf("code %s: counted %v, want %v", c.code, got, c.want)
		}
	}
	if got, want := testutil.ToFloat64(m.lastQueued), float64(1_700_000_000); got != want {
		t.Errorf("last queued timestamp = %v, want %v", got, want)
	}
}

func TestHealthRun(t *testing.T) {
	// Take a port, then free it for Run to bind.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	h := NewHealthServer(addr, time.Second, nil)
	h.SyncNode(false, false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	}()

	if code := getWhenUp(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}

	// A second server cannot bind the same address, and says so.
	err = NewHealthServer(addr, time.Second, nil).Run(context.Background())
	if err == nil {
		t.Fatal("second Run on a bound address returned nil")
	}
	t.Logf("second Run: %v", err)
}

// TestReadyz: the pod is ready once the first sync succeeded, and stays
// ready while its node is drained (tainted by the autoscaler or being
// deleted), when /healthz turns 503 for the load balancers; a sync stuck
// too long makes it unready, as /livez.
func TestReadyz(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	h := NewHealthServer("unused", time.Second, clock.Now)
	h.SyncNode(false, false)
	base := startHealth(t, h)
	if a := getHealth(t, base+"/readyz"); a.code != http.StatusServiceUnavailable {
		t.Errorf("before the first sync: /readyz = %d, want 503", a.code)
	}
	h.Updated()
	if a := getHealth(t, base+"/readyz"); a.code != http.StatusOK {
		t.Errorf("after the first sync: /readyz = %d, want 200", a.code)
	}
	h.SyncNode(false, true)
	if a := getHealth(t, base+"/healthz"); a.code != http.StatusServiceUnavailable {
		t.Errorf("node tainted: /healthz = %d, want 503", a.code)
	}
	if a := getHealth(t, base+"/readyz"); a.code != http.StatusOK {
		t.Errorf("node tainted: /readyz = %d, want 200 (a drained node must not stall a rollout)", a.code)
	}
	h.QueuedUpdate()
	clock.Advance(3 * time.Second)
	if a := getHealth(t, base+"/readyz"); a.code != http.StatusServiceUnavailable {
		t.Errorf("an update queued for 3 sync periods: /readyz = %d, want 503", a.code)
	}
}
