package dataplane

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"sync"
	"time"
)

// HealthServer answers kube-proxy's health endpoints, so that probes, load
// balancers and dashboards written for kube-proxy keep working:
//
//   - /livez is 503 when an update was queued (QueuedUpdate) and no sync has
//     succeeded (Updated) for 2x the sync period since; 200 otherwise.
//   - /healthz is /livez plus the node's eligibility: it is also 503 while
//     the node is unknown, being deleted, or tainted
//     ToBeDeletedByClusterAutoscaler, so that cloud load balancers drain it.
//   - /readyz (onehop's own, for the pod's readiness probe) is /livez once
//     a first sync succeeded, and 503 before. It ignores the node's
//     eligibility: a node being drained is no reason to hold up a
//     DaemonSet rollout, which counts not-ready pods as unavailable.
//
// Both answer JSON with lastUpdated, currentTime (and nodeEligible on
// /healthz) and the header X-Content-Type-Options: nosniff. /healthz also
// names the agent's servers (ServerFailed) and the cloud hook's providers
// (ProviderFailed) that fail now, without changing its status code. As in
// kube-proxy, lastUpdated is the current time while healthy.
//
// The methods are safe for concurrent use.
type HealthServer struct {
	addr    string
	timeout time.Duration
	now     func() time.Time

	mu sync.Mutex
	// lastUpdated is the time of the last successful sync; zero before.
	lastUpdated time.Time
	// oldestQueued is when the oldest update not yet applied was queued;
	// zero when none is pending.
	oldestQueued time.Time
	nodeKnown    bool
	nodeDeleting bool
	nodeTainted  bool
	metrics      *Metrics
	// serverFailures: the agent's other servers (metrics) that cannot
	// serve now, with why (ServerFailed).
	serverFailures map[string]string
	// providerFailures: the cloud hook's providers that failed to start
	// or to take their last update, with why (ProviderFailed).
	providerFailures map[string]string
}

// NewHealthServer returns a health server that will listen on addr
// (host:port) and reports unhealthy when a queued update is not applied
// within 2*syncPeriod. now is the clock; nil means time.Now.
func NewHealthServer(addr string, syncPeriod time.Duration, now func() time.Time) *HealthServer {
	if now == nil {
		now = time.Now
	}
	return &HealthServer{addr: addr, timeout: 2 * syncPeriod, now: now}
}

// SetMetrics makes the server count its answers (kubeproxy_proxy_healthz_total
// and kubeproxy_proxy_livez_total) and record queued updates
// (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds) in m. Call it
// before Run.
func (h *HealthServer) SetMetrics(m *Metrics) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.metrics = m
}

// QueuedUpdate records that a change is waiting to be synced. Only the
// oldest pending change counts: repeated calls do not move the deadline.
func (h *HealthServer) QueuedUpdate() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if h.oldestQueued.IsZero() {
		h.oldestQueued = now
	}
	if h.metrics != nil {
		h.metrics.lastQueued.Set(unixSeconds(now))
	}
}

// Updated records a successful sync: everything queued so far is applied.
func (h *HealthServer) Updated() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastUpdated = h.now()
	h.oldestQueued = time.Time{}
}

// SyncNode records the state of this node: deleting when it is gone or has
// a deletion timestamp, tainted when it carries the
// ToBeDeletedByClusterAutoscaler taint. Until the first call the node is
// unknown and /healthz is not eligible, as in kube-proxy.
func (h *HealthServer) SyncNode(deleting, tainted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeKnown = true
	h.nodeDeleting = deleting
	h.nodeTainted = tainted
}

// ProxyHealthy reports whether the sync loop keeps up: what /livez
// answers, without the node's eligibility. Health-check node ports report
// it as serviceProxyHealthy.
func (h *HealthServer) ProxyHealthy() bool {
	body, _, _ := h.state()
	return body.Healthy
}

// healthBody is the JSON both endpoints answer, in kube-proxy's shape.
type healthBody struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	Healthy      bool      `json:"healthy"`
	// ServerFailures (on /healthz only) names the agent's servers that
	// cannot serve, e.g. a metrics address another process holds, with
	// the error. It does not change the status code: a metrics port is
	// no reason for load balancers to drain the node.
	ServerFailures map[string]string `json:"serverFailures,omitempty"`
	// ProviderFailures (on /healthz only) names the cloud hook's
	// providers that fail to start or to update, with the stage and the
	// error. It does not change the status code either: /healthz is
	// about the dataplane, which serves; a restart of the agent would
	// not cure a missing interface or secret, and a 503 would drain the
	// node from load balancers that reach it by other means.
	ProviderFailures map[string]string `json:"providerFailures,omitempty"`
}

// synced reports whether a sync has succeeded since the server started.
func (h *HealthServer) synced() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.lastUpdated.IsZero()
}

// ServerFailed records that the agent's server what (e.g. "metrics")
// cannot serve because of err, or serves again (err nil); /healthz shows
// it.
func (h *HealthServer) ServerFailed(what string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	setFailure(&h.serverFailures, what, err)
}

// ProviderFailed records that the cloud hook's provider (e.g. "l2") fails
// because of err (its text names the stage), or runs again (err nil);
// /healthz shows it.
func (h *HealthServer) ProviderFailed(provider string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	setFailure(&h.providerFailures, provider, err)
}

// setFailure records err under what in *m, or deletes it when err is nil.
func setFailure(m *map[string]string, what string, err error) {
	if err == nil {
		delete(*m, what)
		return
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[what] = err.Error()
}

// state returns the proxy's health (ignoring the node) and the node's
// eligibility at one instant.
func (h *HealthServer) state() (body healthBody, eligible bool, m *Metrics) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	healthy := h.oldestQueued.IsZero() || now.Sub(h.oldestQueued) < h.timeout
	body = healthBody{LastUpdated: h.lastUpdated, CurrentTime: now, Healthy: healthy}
	if healthy {
		// kube-proxy reports "now" while healthy: older clients read
		// lastUpdated as "the sync loop is alive".
		body.LastUpdated = now
	}
	eligible = h.nodeKnown && !h.nodeDeleting && !h.nodeTainted
	return body, eligible, h.metrics
}

// Handler serves /healthz and /livez.
func (h *HealthServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		body, eligible, m := h.state()
		body.NodeEligible = &eligible
		h.mu.Lock()
		body.ServerFailures = maps.Clone(h.serverFailures)
		body.ProviderFailures = maps.Clone(h.providerFailures)
		h.mu.Unlock()
		body.Healthy = body.Healthy && eligible
		code := writeHealth(w, body)
		if m != nil {
			m.healthz.WithLabelValues(fmt.Sprint(code)).Inc()
		}
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		body, _, _ := h.state()
		body.Healthy = body.Healthy && h.synced()
		writeHealth(w, body)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		body, _, m := h.state()
		code := writeHealth(w, body)
		if m != nil {
			m.livez.WithLabelValues(fmt.Sprint(code)).Inc()
		}
	})
	return mux
}

// writeHealth answers body with 200 when healthy, 503 otherwise, and
// returns the status code.
func writeHealth(w http.ResponseWriter, body healthBody) int {
	code := http.StatusOK
	if !body.Healthy {
		code = http.StatusServiceUnavailable
	}
	out, err := json.Marshal(body)
	if err != nil { // cannot happen: fixed struct of times and bools
		code = http.StatusInternalServerError
		out = []byte(`{}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(out)
	return code
}

// Run listens on the server's address and serves until ctx is done. It
// returns an error when it cannot listen or the server fails; nil after ctx
// is done.
func (h *HealthServer) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", h.addr)
	if err != nil {
		return fmt.Errorf("health server: listen on %s: %w", h.addr, err)
	}
	return h.Serve(ctx, ln)
}

// Serve serves on ln until ctx is done, then closes it.
func (h *HealthServer) Serve(ctx context.Context, ln net.Listener) error {
	slog.InfoContext(ctx, "health server listening", "addr", ln.Addr().String())
	return serveHTTP(ctx, ln, nil, h.Handler(), "health server")
}

// unixSeconds is t as fractional seconds since the epoch, as Prometheus
// timestamps are.
func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}
