package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Limits every HTTP server of the agent shares (health, metrics and the
// health-check node ports). Those ports face the network, and a load
// balancer or scanner that opens connections and never finishes or closes
// them must not hold the agent's goroutines and memory for ever.
const (
	serverReadHeaderTimeout = 10 * time.Second
	serverReadTimeout       = 15 * time.Second
	// serverWriteTimeout bounds an answer; a CPU profile (pprof, 30 s by
	// default) needs longer, so the metrics server with profiling on lifts
	// it (profileWriteTimeout).
	serverWriteTimeout  = 15 * time.Second
	profileWriteTimeout = 2 * time.Minute
	serverIdleTimeout   = 60 * time.Second
	serverMaxHeader     = 16 << 10
)

// newServer is an http.Server with the agent's limits.
func newServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: serverReadHeaderTimeout,
		ReadTimeout:       serverReadTimeout,
		WriteTimeout:      serverWriteTimeout,
		IdleTimeout:       serverIdleTimeout,
		MaxHeaderBytes:    serverMaxHeader,
	}
}

// BindRetry is how long ServeRetrying waits between two attempts to bind
// an address, as kube-proxy does for its health and metrics servers.
const BindRetry = 5 * time.Second

// ServeRetrying binds addr (TCP) and runs serve on it (a HealthServer's
// Serve, or a Metrics' ServeListener) until ctx ends. When the bind or the
// server fails, report gets the error, and it is tried again after retry: a
// port another process holds for a while is served once it is free, instead
// of never. report(nil) follows each successful bind. report may end the
// process (bindAddressHardFail). A failure equal to the previous one is
// logged at debug level only.
func ServeRetrying(ctx context.Context, log *slog.Logger, what, addr string, retry time.Duration,
	serve func(context.Context, net.Listener) error, report func(error)) {
	if retry <= 0 {
		retry = BindRetry
	}
	if report == nil {
		report = func(error) {}
	}
	var last string
	for ctx.Err() == nil {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err == nil {
			report(nil)
			last = ""
			err = serve(ctx, ln)
			if err == nil {
				err = errors.New("stopped")
			}
		} else {
			err = fmt.Errorf("listen on %s: %w", addr, err)
		}
		if ctx.Err() != nil {
			return
		}
		report(err)
		if msg := err.Error(); msg != last {
			log.Error(what+" server failed; retrying", "addr", addr, "err", err, "retry", retry)
			last = msg
		} else {
			log.Debug(what+" server still failing", "addr", addr, "err", err)
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// ServeHandler serves handler on ln with the agent's server limits (header,
// read, write and idle timeouts) until ctx ends: for a server of the
// agent's that is not a HealthServer or Metrics, as ServeRetrying's serve.
func ServeHandler(ctx context.Context, ln net.Listener, handler http.Handler, what string) error {
	return serveHTTP(ctx, ln, nil, handler, what)
}

// serveHTTP serves handler on ln until ctx is done, then shuts the server
// down, giving in-flight requests a moment to finish. srv may be nil (the
// agent's limits, newServer); its Handler is set to handler.
func serveHTTP(ctx context.Context, ln net.Listener, srv *http.Server, handler http.Handler, what string) error {
	if srv == nil {
		srv = newServer(nil)
	}
	srv.Handler = handler
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s on %s: %w", what, ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s on %s: %w", what, ln.Addr(), err)
	}
	return nil
}
