package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the agent's Prometheus metrics. Where a metric means what
// kube-proxy's metric of that name means, it has kube-proxy's name, so that
// existing dashboards and alerts keep working; onehop's own are onehop_*.
//
// onehop syncs both IP families in one step, so the sync metrics carry no
// ip_family label (kube-proxy has one proxier, and one series, per family).
//
// All methods are safe for concurrent use and do nothing on a nil *Metrics.
type Metrics struct {
	now func() time.Time

	syncDuration        prometheus.Histogram
	syncFullDuration    prometheus.Histogram
	syncPartialDuration prometheus.Histogram
	lastSync            prometheus.Gauge
	lastQueued          prometheus.Gauge
	programming         prometheus.Histogram
	endpointChanges     prometheus.Counter
	serviceChanges      prometheus.Counter
	noLocalEndpoints    *prometheus.GaugeVec
	healthz             *prometheus.CounterVec
	livez               *prometheus.CounterVec

	rules           prometheus.Gauge
	elements        prometheus.Gauge
	syncs           *prometheus.CounterVec
	syncFailures    *prometheus.CounterVec
	syncCPU         *prometheus.CounterVec
	changedPortals  prometheus.Counter
	messages        prometheus.Counter
	servicePanics   *prometheus.CounterVec
	serviceProblems *prometheus.CounterVec
	kernelRepairs   *prometheus.CounterVec

	providerUp       *prometheus.GaugeVec
	providerFailures *prometheus.CounterVec
	hook             *hookMetrics

	conntrackEntries prometheus.Gauge
	conntrackMax     prometheus.Gauge

	proxyMode string // answered at /proxyMode; empty: not served
}

// SetProxyMode makes the metrics server answer /proxyMode with mode, as
// kube-proxy's does ("nftables", "ipvs"): tools, and upstream's e2e tests,
// ask it which dataplane a node runs. Call it before serving.
func (m *Metrics) SetProxyMode(mode string) { m.proxyMode = mode }

// syncBuckets are kube-proxy's sync-duration buckets: 1ms doubling to ~16s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's network-programming buckets: 0.25s and
// 0.5s, every second to 59s, every 5s to 115s, every 30s to 5min.
func programmingBuckets() []float64 {
	var b []float64
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	b = append(b, prometheus.LinearBuckets(120, 30, 7)...)
	return b
}

// newGauge, newGaugeVec, newCounter, newCounterVec and newHistogram make
// the metrics NewMetrics and newHookMetrics define, from a name, a help
// text, and a vector's label names or a histogram's buckets.
func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func newGaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func newHistogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// NewMetrics creates the metrics and registers them, with the Go runtime
// and process collectors (go_*, process_*, as kube-proxy exposes), on reg.
// It panics when one is already registered there, as MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		now: time.Now,
		syncDuration: newHistogram("kubeproxy_sync_proxy_rules_duration_seconds",
			"Duration of one sync of the dataplane (full or partial), in seconds.",
			syncBuckets),
		syncFullDuration: newHistogram("kubeproxy_sync_full_proxy_rules_duration_seconds",
			"Duration of full syncs of the dataplane, in seconds.",
			syncBuckets),
		syncPartialDuration: newHistogram("kubeproxy_sync_partial_proxy_rules_duration_seconds",
			"Duration of partial syncs of the dataplane, in seconds.",
			syncBuckets),
		lastSync: newGauge("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			"When the dataplane was last synced successfully, in seconds since the epoch."),
		lastQueued: newGauge("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
			"When a sync of the dataplane was last queued, in seconds since the epoch."),
		programming: newHistogram("kubeproxy_network_programming_duration_seconds",
			"Time from an endpoint change (the EndpointSlice's last-change-trigger-time) "+
				"to the dataplane carrying it, in seconds.",
			programmingBuckets()),
		endpointChanges: newCounter("kubeproxy_sync_proxy_rules_endpoint_changes_total",
			"EndpointSlice changes seen."),
		serviceChanges: newCounter("kubeproxy_sync_proxy_rules_service_changes_total",
			"Service changes seen."),
		noLocalEndpoints: newGaugeVec("kubeproxy_sync_proxy_rules_no_local_endpoints_total",
			"Service ports with a Local traffic policy and no local endpoints, after the last sync.",
			"traffic_policy", "ip_family"),
		healthz: newCounterVec("kubeproxy_proxy_healthz_total",
			"Answers of /healthz, by HTTP status code.",
			"code"),
		livez: newCounterVec("kubeproxy_proxy_livez_total",
			"Answers of /livez, by HTTP status code.",
			"code"),

		rules: newGauge("onehop_rules",
			"Rules in onehop's ruleset after the last successful sync."),
		elements: newGauge("onehop_map_elements",
			"Map and set elements in onehop's ruleset after the last successful sync."),
		syncs: newCounterVec("onehop_syncs_total",
			"Syncs of the dataplane attempted, by mode (full or partial).",
			"mode"),
		syncFailures: newCounterVec("onehop_sync_failures_total",
			"Syncs of the dataplane that failed (the kernel kept its previous state), by mode.",
			"mode"),
		syncCPU: newCounterVec("onehop_sync_cpu_seconds_total",
			"CPU time the syncs of the dataplane spent, the kernel's work on their messages included "+
				"(not the time they waited for a CPU), by mode: the duration histograms less this is waiting.",
			"mode"),
		changedPortals: newCounter("onehop_sync_changed_portals_total",
			"Service ports whose kernel state a successful sync changed."),
		messages: newCounter("onehop_sync_messages_total",
			"Netlink messages (or commands) sent by successful syncs."),
		servicePanics: newCounterVec("onehop_service_panics_total",
			"Panics recovered while building one Service's portals (stage build) or rendering "+
				"them in the dataplane (stage render); each left that Service out and gave it an event.",
			"stage"),
		serviceProblems: newCounterVec("onehop_service_dataplane_problems_total",
			"Services, or parts of them, the dataplane could not program as asked while it synced every "+
				"other Service (each also an event on the Service), by event reason.",
			"reason"),
		kernelRepairs: newCounterVec("onehop_kernel_repairs_total",
			"Full syncs made because someone else changed the dataplane's kernel state (seen by its events or its periodic check), by backend.",
			"backend"),
		// Shaped as MetalLB's metallb_bgp_session_up (a 0/1 gauge) and
		// metallb_k8s_client_update_errors_total (a counter of failures).
		providerUp: newGaugeVec("onehop_provider_up",
			"1 while the cloud hook's provider (bgp, l2, webhook, ...) runs and took its last update, 0 while it fails to start or update.",
			"provider"),
		providerFailures: newCounterVec("onehop_provider_failures_total",
			"Failed attempts of the cloud hook's providers, by provider and stage (start or update); each is retried with back-off.",
			"provider", "stage"),
		hook: newHookMetrics(),
	}
	// Series that exist from the start, so that rate() and absent() work
	// before the first event.
	for _, mode := range []string{"full", "partial"} {
		m.syncs.WithLabelValues(mode)
		m.syncFailures.WithLabelValues(mode)
		m.syncCPU.WithLabelValues(mode)
	}
	for _, stage := range []string{PanicStageBuild, PanicStageRender} {
		m.servicePanics.WithLabelValues(stage)
	}
	for _, code := range []string{"200", "503"} {
		m.healthz.WithLabelValues(code)
		m.livez.WithLabelValues(code)
	}
	m.conntrackEntries = newGauge("onehop_conntrack_entries",
		"Entries in the conntrack table of the agent's network namespace (nf_conntrack_count).")
	m.conntrackMax = newGauge("onehop_conntrack_max",
		"The most entries the conntrack table may hold (nf_conntrack_max); beyond it the kernel drops new connections.")
	reg.MustRegister(m.hook.collectors()...)
	reg.MustRegister(m.conntrackEntries, m.conntrackMax)
	reg.MustRegister(
		m.syncDuration, m.syncFullDuration, m.syncPartialDuration, m.lastSync, m.lastQueued,
		m.programming, m.endpointChanges, m.serviceChanges, m.noLocalEndpoints, m.healthz, m.livez,
		m.rules, m.elements, m.syncs, m.syncFailures, m.syncCPU, m.changedPortals, m.messages, m.servicePanics, m.serviceProblems,
		m.kernelRepairs,
		m.providerUp, m.providerFailures,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// ObserveSync records one Sync of the dataplane and its outcome. Durations
// are recorded for failed syncs too (as kube-proxy does); the last-sync time
// and the ruleset sizes only for successful ones.
func (m *Metrics) ObserveSync(s SyncStats, err error) {
	if m == nil {
		return
	}
	mode := "partial"
	byMode := m.syncPartialDuration
	if s.Full {
		mode = "full"
		byMode = m.syncFullDuration
	}
	m.syncs.WithLabelValues(mode).Inc()
	m.syncCPU.WithLabelValues(mode).Add(max(s.CPU, 0).Seconds())
	m.ServicePanics(PanicStageRender, len(s.Panics))
	for _, p := range s.Problems {
		m.serviceProblems.WithLabelValues(p.Reason).Inc()
	}
	if s.Duration > 0 {
		m.syncDuration.Observe(s.Duration.Seconds())
		byMode.Observe(s.Duration.Seconds())
	}
	if err != nil {
		m.syncFailures.WithLabelValues(mode).Inc()
		return
	}
	m.lastSync.Set(unixSeconds(m.now()))
	m.rules.Set(float64(s.Rules))
	m.elements.Set(float64(s.Elements))
	m.changedPortals.Add(float64(s.Changed))
	m.messages.Add(float64(s.Messages))
}

// KernelRepaired counts one repair of backend's kernel state, changed by
// someone else, in onehop_kernel_repairs_total.
func (m *Metrics) KernelRepaired(backend string) {
	if m == nil {
		return
	}
	m.kernelRepairs.WithLabelValues(backend).Inc()
}

// The stages of onehop_service_panics_total.
const (
	PanicStageBuild  = "build"  // portal: Kubernetes objects to portals
	PanicStageRender = "render" // a backend: portals to kernel objects
)

// ServicePanics counts n panics recovered at stage (PanicStageBuild or
// PanicStageRender). Those of a backend's Sync are counted by ObserveSync.
func (m *Metrics) ServicePanics(stage string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.servicePanics.WithLabelValues(stage).Add(float64(n))
}

// ProviderUp sets onehop_provider_up of the cloud hook's provider: up
// when it runs and took its last update.
func (m *Metrics) ProviderUp(provider string, up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.providerUp.WithLabelValues(provider).Set(v)
}

// ProviderFailed counts one failed attempt of provider at stage ("start"
// or "update") in onehop_provider_failures_total.
func (m *Metrics) ProviderFailed(provider, stage string) {
	if m == nil {
		return
	}
	m.providerFailures.WithLabelValues(provider, stage).Inc()
}

// ObserveProgramming records the time from an endpoint change (the
// EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time) to the
// sync that put it in the kernel. Negative durations (clock skew) count as 0.
func (m *Metrics) ObserveProgramming(d time.Duration) {
	if m == nil {
		return
	}
	m.programming.Observe(max(d, 0).Seconds())
}

// EndpointChanges counts n EndpointSlice changes.
func (m *Metrics) EndpointChanges(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.endpointChanges.Add(float64(n))
}

// ServiceChanges counts n Service changes.
func (m *Metrics) ServiceChanges(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.serviceChanges.Add(float64(n))
}

// NoLocalEndpoints sets how many Service ports of family ("ipv4", "IPv4",
// "4", or the IPv6 equivalents) have a Local traffic policy (external for
// externalTrafficPolicy, else internalTrafficPolicy) and no local endpoint.
// It is a gauge, despite its kube-proxy name: set it after every sync.
func (m *Metrics) NoLocalEndpoints(family string, external bool, n int) {
	if m == nil {
		return
	}
	policy := "internal"
	if external {
		policy = "external"
	}
	m.noLocalEndpoints.WithLabelValues(policy, kubeFamily(family)).Set(float64(n))
}

// kubeFamily spells an IP family as Kubernetes does (IPv4, IPv6), the
// ip_family label values of kube-proxy's metrics.
func kubeFamily(f string) string {
	switch strings.ToLower(f) {
	case "ipv4", "4", "inet", "ip":
		return "IPv4"
	case "ipv6", "6", "inet6", "ip6":
		return "IPv6"
	}
	return f
}

// Serve listens on addr and serves until ctx is done: /metrics from reg,
// /healthz ("ok": the process answers), and /debug/pprof/ when profiling.
func (m *Metrics) Serve(ctx context.Context, addr string, reg prometheus.Gatherer, profiling bool) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics server: listen on %s: %w", addr, err)
	}
	return m.ServeListener(ctx, ln, reg, profiling)
}

// ServeListener is Serve on a listener the caller opened; it closes ln.
func (m *Metrics) ServeListener(ctx context.Context, ln net.Listener, reg prometheus.Gatherer, profiling bool) error {
	if reg == nil {
		_ = ln.Close()
		return errors.New("metrics server: no gatherer")
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte("ok"))
	})
	if m.proxyMode != "" {
		mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			_, _ = w.Write([]byte(m.proxyMode))
		})
	}
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	slog.InfoContext(ctx, "metrics server listening", "addr", ln.Addr().String(), "profiling", profiling)
	srv := newServer(nil)
	if profiling {
		srv.WriteTimeout = profileWriteTimeout
	}
	return serveHTTP(ctx, ln, srv, mux, "metrics server")
}
