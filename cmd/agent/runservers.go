package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/config"
	"github.com/onehop/onehop/dataplane"
)

// serveHealthAndMetrics starts run's HTTP servers, each unless its
// address is empty: the health server (dataplane.HealthServer) on
// f.HealthzAddr and the metrics server (Metrics.ServeListener: /metrics,
// /proxyMode, with f.Profiling /debug/pprof) on f.MetricsAddr, until ctx
// ends. It returns the health server, nil without one; fatal stops the
// agent.
func serveHealthAndMetrics(ctx context.Context, f *config.Settings, log *slog.Logger, reg *prometheus.Registry,
	metrics *dataplane.Metrics, fatal context.CancelCauseFunc) *dataplane.HealthServer {
	// A health or metrics address that cannot be bound (another process
	// holds it) is retried every few seconds, as in kube-proxy, unless
	// bindAddressHardFail asks to exit.
	var health *dataplane.HealthServer
	// report follows the health and metrics servers: a failure is shown in
	// /healthz (the metrics server's), or ends the agent with
	// bindAddressHardFail.
	report := func(what, addr string) func(error) {
		return func(err error) {
			if err != nil && f.BindAddressHardFail {
				fatal(fmt.Errorf("%s server on %s (bindAddressHardFail): %w", what, addr, err))
			}
			if health != nil && what != "healthz" {
				health.ServerFailed(what, err)
			}
		}
	}
	if f.HealthzAddr != "" {
		health = dataplane.NewHealthServer(f.HealthzAddr, f.SyncPeriod, nil)
		health.SetMetrics(metrics)
		go dataplane.ServeRetrying(ctx, log, "healthz", f.HealthzAddr, dataplane.BindRetry, health.Serve,
			report("healthz", f.HealthzAddr))
	}
	if f.MetricsAddr != "" {
		serve := func(ctx context.Context, ln net.Listener) error {
			return metrics.ServeListener(ctx, ln, reg, f.Profiling)
		}
		go dataplane.ServeRetrying(ctx, log, "metrics", f.MetricsAddr, dataplane.BindRetry, serve,
			report("metrics", f.MetricsAddr))
	}
	return health
}
