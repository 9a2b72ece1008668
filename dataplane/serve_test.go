package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/portal"
)

// TestServeRetryingBindsOnceFree: the health address is held by someone
// else at start; every failed bind is reported, and once the holder lets
// go the server answers, without a restart of the agent.
func TestServeRetryingBindsOnceFree(t *testing.T) {
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := holder.Addr().String()
	h := NewHealthServer(addr, time.Second, nil)
	h.SyncNode(false, false)
	ctx, cancel := context.WithCancel(context.Background())
	var failures, ups atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeRetrying(ctx, slog.Default(), "healthz", addr, 20*time.Millisecond, h.Serve, func(err error) {
			if err != nil {
				failures.Add(1)
			} else {
				ups.Add(1)
			}
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(10 * time.Second)
	for failures.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := failures.Load(); n < 2 {
		t.Fatalf("%d bind failures reported while the address was taken, want at least 2 (one per retry)", n)
	}
	if n := ups.Load(); n != 0 {
		t.Fatalf("bind reported up %d times while the address was taken", n)
	}
	holder.Close()
	if code := getWhenUp(t, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if n := ups.Load(); n != 1 {
		t.Errorf("bind reported up %d times, want 1", n)
	}
}

// TestHealthzShowsServerFailures: a server the agent cannot run (a metrics
// address another process holds) shows in /healthz's body, without
// turning the node unhealthy, and goes once it serves.
func TestHealthzShowsServerFailures(t *testing.T) {
	h := NewHealthServer("", time.Second, nil)
	h.SyncNode(false, false)
	get := func() (int, healthBody) {
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		var b healthBody
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
			t.Fatal(err)
		}
		return rec.Code, b
	}
	h.ServerFailed("metrics", errors.New("listen on 127.0.0.1:10249: address already in use"))
	code, b := get()
	if code != http.StatusOK || b.ServerFailures["metrics"] == "" {
		t.Errorf("with metrics failing: %d %+v, want 200 naming metrics", code, b)
	}
	h.ServerFailed("metrics", nil)
	if code, b = get(); code != http.StatusOK || len(b.ServerFailures) != 0 {
		t.Errorf("with metrics serving again: %d %+v, want 200 and no failures", code, b)
	}
}

// getWhenUp GETs url until a server answers there (at most 10 s) and
// returns the status code.
func getWhenUp(t *testing.T, url string) int {
	t.Helper()
	var err error
	for range 1000 {
		var resp *http.Response
		if resp, err = http.Get(url); err == nil {
			resp.Body.Close()
			return resp.StatusCode
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no server answered %s: %v", url, err)
	return 0
}

// TestServeRetryingStopsWithContext: a cancelled context ends the loop
// even while it waits to retry, and a server that stops because of the
// cancel is not a failure.
func TestServeRetryingStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var failures atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeRetrying(ctx, slog.Default(), "test", "127.0.0.1:0", time.Hour, func(_ context.Context, ln net.Listener) error {
			ln.Close()
			return errors.New("server broke")
		}, func(err error) {
			if err != nil {
				failures.Add(1)
			}
		})
	}()
	for failures.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeRetrying did not return after cancel")
	}
	if n := failures.Load(); n != 1 {
		t.Errorf("%d failures reported, want 1", n)
	}
}

// TestServersBoundIdleConnections: every server kind carries the read,
// write and idle limits, so that clients that open connections to a
// health-check node port and never finish cannot pile up on every node.
func TestServersBoundIdleConnections(t *testing.T) {
	for _, srv := range []*http.Server{newServer(nil)} {
		if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes <= 0 {
			t.Fatalf("server without a bound: %+v", srv)
		}
	}
	sh := NewServiceHealth(slog.Default(), nil, WithHealthListener(func(ctx context.Context, _ uint16) (net.Listener, error) {
		var lc net.ListenConfig
		return lc.Listen(ctx, "tcp", "127.0.0.1:0")
	}))
	defer sh.Close()
	srv, err := sh.start(30000, hcWant{svc: portal.ServiceKey{Namespace: "ns", Name: "web"}, count: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.stop()
	if srv.srv.IdleTimeout != serverIdleTimeout || srv.srv.ReadHeaderTimeout != serverReadHeaderTimeout {
		t.Errorf("health-check node port server has idle %v, read-header %v; want %v, %v",
			srv.srv.IdleTimeout, srv.srv.ReadHeaderTimeout, serverIdleTimeout, serverReadHeaderTimeout)
	}
}
