package dataplane

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/onehop/onehop/portal"
)

// EventFunc reports a problem on a Service to its owner (a Kubernetes event
// in the agent). reason is a CamelCase word, message a sentence.
type EventFunc func(svc portal.ServiceKey, reason, message string)

// ReasonHealthCheckFailed is the event reason when a health-check node port
// cannot be served; kube-proxy uses the same word.
const ReasonHealthCheckFailed = "FailedToStartServiceHealthcheck"

// ServiceHealth serves the health-check node ports of the Services with
// externalTrafficPolicy: Local, as kube-proxy does, so that external load
// balancers send traffic only to nodes with local endpoints. Each port gets
// an HTTP server on every address of the node (both families) that answers
// any path with:
//
//   - 200 when this node has local endpoints for the Service and the proxy
//     is healthy, 503 otherwise;
//   - the JSON body {"service":{"namespace","name"},"localEndpoints":N,
//     "serviceProxyHealthy":bool};
//   - the headers Content-Type: application/json, X-Content-Type-Options:
//     nosniff and X-Load-Balancing-Endpoint-Weight: N.
//
// Update (called after each applied sync) starts and stops servers as
// Services come and go; a port that cannot be bound is reported through the
// EventFunc (once per distinct failure, not at every retry) and retried at
// every Update. The methods are safe for concurrent use.
type ServiceHealth struct {
	log     *slog.Logger
	events  EventFunc
	healthy func() bool
	listen  func(ctx context.Context, port uint16) (net.Listener, error)

	mu      sync.Mutex
	servers map[uint16]*hcServer
	// reported holds the failure last reported per Service, so that a
	// retry failing the same way at every sync does not repeat the event.
	reported map[portal.ServiceKey]string
	closed   bool
	// wanted holds the applied Services that need a health-check node
	// port, kept up to date from each snapshot's Dirty Services (the
	// first snapshot is taken whole), so an Update costs in proportion to
	// the changes and to these Services, not to every Service.
	wanted map[portal.ServiceKey]*portal.Service
	seeded bool
}

// ServiceHealthOption configures a ServiceHealth.
type ServiceHealthOption func(*ServiceHealth)

// WithProxyHealth makes the servers report healthy() as serviceProxyHealthy
// (and answer 503 while it is false), e.g. HealthServer.ProxyHealthy.
// Without it the proxy counts as healthy.
func WithProxyHealth(healthy func() bool) ServiceHealthOption {
	return func(s *ServiceHealth) { s.healthy = healthy }
}

// WithHealthListener replaces how a port is bound (default: TCP on every
// address of both families). Tests use it to listen inside a namespace.
func WithHealthListener(listen func(ctx context.Context, port uint16) (net.Listener, error)) ServiceHealthOption {
	return func(s *ServiceHealth) { s.listen = listen }
}

// NewServiceHealth returns a ServiceHealth with no servers; events may be nil.
func NewServiceHealth(log *slog.Logger, events EventFunc, opts ...ServiceHealthOption) *ServiceHealth {
	if log == nil {
		log = slog.Default()
	}
	s := &ServiceHealth{log: log, events: events, servers: map[uint16]*hcServer{}, reported: map[portal.ServiceKey]string{},
		wanted: map[portal.ServiceKey]*portal.Service{}}
	for _, o := range opts {
		o(s)
	}
	if s.healthy == nil {
		s.healthy = func() bool { return true }
	}
	if s.listen == nil {
		s.listen = listenAllAddrs
	}
	return s
}

// listenAllAddrs binds port on every address: Go's ":port" is one socket
// for IPv6 and IPv4-mapped addresses, or IPv4 only where IPv6 is off.
func listenAllAddrs(ctx context.Context, port uint16) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", ":"+strconv.Itoa(int(port)))
}

// hcServer is one health-check node port.
type hcServer struct {
	port uint16
	svc  portal.ServiceKey
	srv  *http.Server
	done chan struct{}

	mu             sync.Mutex
	localEndpoints int
}

// hcWant is what one health-check node port should answer for.
type hcWant struct {
	svc   portal.ServiceKey
	count int
}

// Update makes the servers match snap: one per health-check node port of a
// Service with externalTrafficPolicy: Local, answering for the number of
// local endpoints snap gives. It keeps the *Service values it serves, not
// snap.Services.
func (s *ServiceHealth) Update(snap *portal.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	take := func(k portal.ServiceKey, svc *portal.Service) {
		if svc != nil && hcPort(svc) != 0 {
			s.wanted[k] = svc
		} else {
			delete(s.wanted, k)
		}
	}
	if !s.seeded {
		for k, svc := range snap.Services {
			take(k, svc)
		}
		s.seeded = true
	} else {
		for _, k := range snap.Dirty {
			take(k, snap.Services[k])
		}
	}
	want := map[uint16]hcWant{}
	var clashes []hcWant
	// Sorted, so that on a (API-forbidden) port clash the same Service wins
	// every time.
	keys := slices.SortedFunc(maps.Keys(s.wanted), func(a, b portal.ServiceKey) int {
		if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	for _, k := range keys {
		svc := s.wanted[k]
		port := hcPort(svc)
		w := hcWant{svc: k, count: localEndpointCount(svc)}
		if _, taken := want[port]; taken { // forbidden by the API; first in order wins
			clashes = append(clashes, w)
			continue
		}
		want[port] = w
	}

	failing := map[portal.ServiceKey]bool{}
	for _, w := range clashes {
		port := hcPort(s.wanted[w.svc])
		s.fail(w.svc, port, fmt.Sprintf("health check node port %d is already served for %s", port, want[port].svc), nil)
		failing[w.svc] = true
	}
	for port, srv := range s.servers {
		if w, ok := want[port]; !ok || w.svc != srv.svc {
			srv.stop()
			delete(s.servers, port)
			s.log.Info("health check node port stopped", "service", srv.svc.String(), "port", port)
		}
	}
	for port, w := range want {
		if srv, ok := s.servers[port]; ok {
			srv.setCount(w.count)
			continue
		}
		srv, err := s.start(port, w)
		if err != nil {
			s.fail(w.svc, port, fmt.Sprintf("failed to start the health check on node port %d: %v", port, err), err)
			failing[w.svc] = true
			continue
		}
		s.servers[port] = srv
		s.log.Info("health check node port serving", "service", w.svc.String(), "port", port, "local_endpoints", w.count)
	}
	for k := range s.reported {
		if !failing[k] {
			delete(s.reported, k)
		}
	}
}

// fail logs and reports a failure of svc's health check; the same failure
// again is only logged at debug level. Called with s.mu held.
func (s *ServiceHealth) fail(svc portal.ServiceKey, port uint16, msg string, err error) {
	if s.reported[svc] == msg {
		s.log.Debug("health check node port still cannot be served", "service", svc.String(), "port", port, "reason", msg)
		return
	}
	s.reported[svc] = msg
	s.log.Error("cannot serve health check node port; retrying at every sync", "service", svc.String(), "port", port, "reason", msg, "err", err)
	s.event(svc, msg)
}

func (s *ServiceHealth) event(svc portal.ServiceKey, msg string) {
	if s.events != nil {
		s.events(svc, ReasonHealthCheckFailed, msg)
	}
}

// hcPort is the health-check node port svc needs served, 0 for none.
func hcPort(svc *portal.Service) uint16 {
	for _, p := range svc.Portals {
		if p.HealthCheckNodePort != 0 {
			return p.HealthCheckNodePort
		}
	}
	return 0
}

// localEndpointCount is the number of ready local endpoints of svc: the
// most any of its portals has, so that a pod counts once however many ports
// and families the Service has. Terminating endpoints do not count, as in
// kube-proxy: a node left with only those is drained.
func localEndpointCount(svc *portal.Service) int {
	n := 0
	for _, p := range svc.Portals {
		n = max(n, p.LocalReady)
	}
	return n
}

func (s *ServiceHealth) start(port uint16, w hcWant) (*hcServer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ln, err := s.listen(ctx, port)
	if err != nil {
		return nil, err
	}
	srv := &hcServer{port: port, svc: w.svc, localEndpoints: w.count, done: make(chan struct{})}
	srv.srv = newServer(&hcHandler{srv: srv, healthy: s.healthy})
	srv.srv.ErrorLog = slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	go func() {
		defer close(srv.done)
		if err := srv.srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			s.log.Error("health check node port server failed", "service", w.svc.String(), "port", port, "err", err)
		}
	}()
	return srv, nil
}

func (h *hcServer) setCount(n int) {
	h.mu.Lock()
	h.localEndpoints = n
	h.mu.Unlock()
}

func (h *hcServer) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.localEndpoints
}

// stop closes the listener and every connection at once: the port must be
// free for whoever gets it next.
func (h *hcServer) stop() {
	_ = h.srv.Close()
	<-h.done
}

// Ports returns the ports being served, sorted.
func (s *ServiceHealth) Ports() []uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint16, 0, len(s.servers))
	for p := range s.servers {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Close stops every server; later Updates do nothing.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for port, srv := range s.servers {
		srv.stop()
		delete(s.servers, port)
	}
}

// hcHandler answers every path of one health-check node port.
type hcHandler struct {
	srv     *hcServer
	healthy func() bool
}

// hcBody is the JSON a health-check node port answers, in kube-proxy's shape.
type hcBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (h *hcHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	var body hcBody
	body.Service.Namespace, body.Service.Name = h.srv.svc.Namespace, h.srv.svc.Name
	body.LocalEndpoints = h.srv.count()
	body.ServiceProxyHealthy = h.healthy()
	code := http.StatusServiceUnavailable
	if body.LocalEndpoints > 0 && body.ServiceProxyHealthy {
		code = http.StatusOK
	}
	out, err := json.MarshalIndent(body, "", "\t")
	if err != nil { // cannot happen: fixed struct of strings, an int and a bool
		out, code = []byte(`{}`), http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(body.LocalEndpoints))
	w.WriteHeader(code)
	_, _ = w.Write(out)
}
