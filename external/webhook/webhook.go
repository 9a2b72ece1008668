package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"
)

// Config configures the webhook provider.
type Config struct {
	// URL receives the POSTs; it must be https unless AllowInsecureHTTP.
	URL string `json:"url"`
	// AllowInsecureHTTP permits an http:// URL, which sends the state and
	// its signature in clear text (for a receiver on the same host).
	AllowInsecureHTTP bool `json:"allowInsecureHTTP,omitempty"`
	// CAFile is a PEM bundle of the CAs trusted to sign the receiver's
	// certificate instead of the system's (a private CA).
	CAFile string `json:"caFile,omitempty"`
	// CA is such a bundle itself (from a LoadBalancerWebhook); CAFile wins.
	CA []byte `json:"-"`
	// SecretFile holds the HMAC key (the agent reads it; the DaemonSet
	// mounts a Secret). Secret is the key itself, for tests.
	SecretFile string `json:"secretFile,omitempty"`
	Secret     string `json:"-"`
	// TimeoutSeconds per request (default 5); retries back off from 200ms
	// to MaxBackoffSeconds (default 30) until the state changes again.
	TimeoutSeconds    float64 `json:"timeoutSeconds,omitempty"`
	MaxBackoffSeconds float64 `json:"maxBackoffSeconds,omitempty"`
}

// Port is one Service port.
type Port struct {
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
}

// Node is a node that should receive the Service's traffic.
type Node struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses"`
}

// Payload is the body of one POST about one Service: its complete desired
// state. A Service that no longer has external IPs is sent once with empty
// IPs and Nodes and Deleted set.
type Payload struct {
	Service             string   `json:"service"`
	IPs                 []string `json:"ips"`
	Ports               []Port   `json:"ports"`
	HealthCheckNodePort uint16   `json:"healthCheckNodePort,omitempty"`
	Nodes               []Node   `json:"nodes"`
	Deleted             bool     `json:"deleted,omitempty"`
	// Generation grows with every message, across leaders (see
	// Generation), so that a receiver can drop a message that arrives
	// after a newer one.
	Generation uint64 `json:"generation"`
}

// Snapshot is the body of the first POST of every leadership term: the
// complete desired state of every Service with external IPs, each listed
// Payload carrying the snapshot's Generation. A receiver deletes the
// Services it holds that are not listed, unless it holds a newer generation
// for them (see Mirror).
type Snapshot struct {
	// Snapshot is always true; it tells a Snapshot from a Payload.
	Snapshot   bool      `json:"snapshot"`
	Generation uint64    `json:"generation"`
	Services   []Payload `json:"services"`
}

// Notifier sends the desired state while this agent leads. Lead starts a
// leadership term: the first Set after it sends a Snapshot, later ones
// each changed Service; one goroutine per Service with a message pending
// delivers its newest state, retrying failures with back-off, at most
// maxInFlight requests at once over as many kept connections. When the term ends (Demote, or
// the context given to Lead ends) every pending message and retry is
// dropped at once, and Set does nothing until the next Lead.
type Notifier struct {
	cfg    Config
	secret []byte
	http   *http.Client
	// inFlight holds a token per request being sent (maxInFlight).
	inFlight chan struct{}
	log      *slog.Logger
	onErr    func(service string, err error, attempt int)
	onOK     func(service string)
	wg       sync.WaitGroup

	mu       sync.Mutex
	base     context.Context
	term     *term
	lastTerm uint64
}

// term is what one leadership term has sent and is sending.
type term struct {
	number   uint64
	ctx      context.Context
	cancel   func()
	count    uint64
	snapshot bool              // the snapshot is queued
	last     map[string]string // service -> canonical JSON of what was queued (without generation); deleted ones leave
	slots    map[string]*slot  // service ("" for the snapshot) -> its delivery, while one is pending or in flight
}

// message is one signed-on-send POST body.
type message struct {
	service string // "" for a snapshot
	gen     uint64
	body    []byte
}

type slot struct {
	wake    chan struct{}
	pending *message
}

// New returns a Notifier. onErr (may be nil) is told about every failed
// attempt, onOK about every delivered message; service is "" for a
// snapshot.
func New(cfg Config, log *slog.Logger, onErr func(service string, err error, attempt int), onOK func(service string)) (*Notifier, error) {
	if err := checkURL(cfg); err != nil {
		return nil, err
	}
	secret := []byte(cfg.Secret)
	if cfg.SecretFile != "" {
		b, err := readSecret(cfg.SecretFile)
		if err != nil {
			return nil, err
		}
		secret = b
	}
	if len(secret) == 0 {
		return nil, fmt.Errorf("webhook: a secret (secretFile) is required to sign requests")
	}
	if cfg.TimeoutSeconds <= 0 {
		cfg.TimeoutSeconds = 5
	}
	if cfg.MaxBackoffSeconds <= 0 {
		cfg.MaxBackoffSeconds = 30
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = maxInFlight
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	pem, from := cfg.CA, "the CA bundle"
	if cfg.CAFile != "" {
		b, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("webhook: caFile: %w", err)
		}
		pem, from = b, "caFile "+cfg.CAFile
	}
	if len(pem) > 0 {
		pool, err := certPool(pem, from)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	client := &http.Client{Transport: tr, Timeout: seconds(cfg.TimeoutSeconds),
		// A redirect could lead to plain http or elsewhere: it counts as a failure.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if onErr == nil {
		onErr = func(string, error, int) {}
	}
	if onOK == nil {
		onOK = func(string) {}
	}
	return &Notifier{cfg: cfg, secret: secret, http: client, inFlight: make(chan struct{}, maxInFlight), log: log, onErr: onErr, onOK: onOK, base: context.Background()}, nil
}

// Check reports what New would refuse in cfg without reading any file:
// the URL, a CA bundle given inline, and a missing secret (when given
// inline: Secret without SecretFile).
func (cfg Config) Check() error {
	if err := checkURL(cfg); err != nil {
		return err
	}
	if len(cfg.CA) > 0 {
		if _, err := certPool(cfg.CA, "the CA bundle"); err != nil {
			return err
		}
	}
	if cfg.SecretFile == "" && cfg.Secret == "" {
		return fmt.Errorf("webhook: a secret is required to sign requests")
	}
	return nil
}

func certPool(pem []byte, from string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("webhook: %s holds no PEM certificate", from)
	}
	return pool, nil
}

func checkURL(cfg Config) error {
	if cfg.URL == "" {
		return fmt.Errorf("webhook: url is required")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return fmt.Errorf("webhook: url: %w", err)
	}
	switch {
	case u.Host == "":
		return fmt.Errorf("webhook: url %q has no host", cfg.URL)
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && cfg.AllowInsecureHTTP:
		return nil
	case u.Scheme == "http":
		return fmt.Errorf("webhook: url %q is plain http, which would send the state and its signature in clear text; use https, or set allowInsecureHTTP: true", cfg.URL)
	}
	return fmt.Errorf("webhook: url %q: scheme must be https", cfg.URL)
}

// Start binds every term's delivery goroutines to ctx as well; call once
// before Lead.
func (n *Notifier) Start(ctx context.Context) {
	n.mu.Lock()
	n.base = ctx
	n.mu.Unlock()
}

// Lead starts leadership term number (recorded in the apiserver by the
// caller, above every term before it), ending the current one. The term
// ends when ctx ends or at Demote. The first Set of the term sends a
// Snapshot.
func (n *Notifier) Lead(ctx context.Context, number uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := checkTerm(number, n.lastTerm); err != nil {
		return err
	}
	n.endTerm()
	tctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(n.base, cancel)
	n.term = &term{number: number, ctx: tctx, cancel: func() { stop(); cancel() },
		last: map[string]string{}, slots: map[string]*slot{}}
	n.lastTerm = number
	n.log.Info("webhook: leading", "term", number)
	return nil
}

// Demote ends the current term: pending messages, retries and requests in
// flight are dropped at once.
func (n *Notifier) Demote() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.term != nil {
		n.log.Info("webhook: demoted, pending messages dropped", "term", n.term.number)
	}
	n.endTerm()
}

// endTerm: caller holds n.mu.
func (n *Notifier) endTerm() {
	if n.term != nil {
		n.term.cancel()
		n.term = nil
	}
}

// Set makes states the desired state of every Service: the first call of
// a term sends them all as a Snapshot; later calls send the changed ones,
// and Services missing from states once as deleted. Outside a term it does
// nothing.
func (n *Notifier) Set(states []Payload) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.term
	if t == nil || t.ctx.Err() != nil {
		return
	}
	if !t.snapshot {
		gen, ok := n.next(t)
		if !ok {
			return
		}
		snap := Snapshot{Snapshot: true, Generation: gen, Services: make([]Payload, 0, len(states))}
		for _, p := range states {
			if p.Deleted {
				continue
			}
			p.Generation = gen
			t.last[p.Service] = canonical(p)
			snap.Services = append(snap.Services, p)
		}
		t.snapshot = true
		n.queue(t, "", gen, snap)
		return
	}
	seen := map[string]bool{}
	for _, p := range states {
		seen[p.Service] = true
		if !n.send(t, p) {
			return
		}
	}
	for svc := range t.last {
		if !seen[svc] {
			if !n.send(t, Payload{Service: svc, IPs: []string{}, Ports: []Port{}, Nodes: []Node{}, Deleted: true}) {
				return
			}
			// Sent as deleted once: a Service gone leaves nothing of
			// itself in the term, which a stream of Services created
			// and deleted would otherwise grow without bound.
			delete(t.last, svc)
		}
	}
}

func canonical(p Payload) string {
	if p.Deleted {
		return "deleted"
	}
	p.Generation = 0
	b, _ := json.Marshal(p)
	return string(b)
}

// send queues p unless it is what was last queued for its Service; false
// when the term has ended. Caller holds n.mu.
func (n *Notifier) send(t *term, p Payload) bool {
	c := canonical(p)
	if t.last[p.Service] == c {
		return true
	}
	gen, ok := n.next(t)
	if !ok {
		return false
	}
	t.last[p.Service] = c
	p.Generation = gen
	n.queue(t, p.Service, gen, p)
	return true
}

// next returns the term's next generation; when its counter is spent the
// term ends (no generation of a later term may be reused). Caller holds
// n.mu.
func (n *Notifier) next(t *term) (uint64, bool) {
	if t.count == maxCount {
		n.log.Error("webhook: this term's generations are spent; nothing more is sent until the next leadership term", "term", t.number)
		n.endTerm()
		return 0, false
	}
	t.count++
	return Generation(t.number, t.count), true
}

// queue: caller holds n.mu.
func (n *Notifier) queue(t *term, key string, gen uint64, v any) {
	body, err := json.Marshal(v)
	if err != nil { // not for these types
		n.log.Error("webhook: encode", "err", err)
		return
	}
	s := t.slots[key]
	if s == nil {
		s = &slot{wake: make(chan struct{}, 1)}
		t.slots[key] = s
		n.wg.Add(1)
		go n.deliver(t, key, s)
	}
	s.pending = &message{service: key, gen: gen, body: body}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (n *Notifier) take(s *slot) *message {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := s.pending
	s.pending = nil
	return m
}

// idle removes s, the delivery of key, from t once nothing is pending for
// it, and reports whether it did: its goroutine then ends, and the next
// message for key starts another. So a term holds a goroutine per Service
// with a message pending or in flight, not per Service it ever sent.
func (n *Notifier) idle(t *term, key string, s *slot) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.pending != nil {
		return false
	}
	if t.slots[key] == s {
		delete(t.slots, key)
	}
	return true
}

func (n *Notifier) deliver(t *term, key string, s *slot) {
	defer n.wg.Done()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-s.wake:
		}
		m := n.take(s)
		backoff := 200 * time.Millisecond
		for attempt := 1; m != nil; attempt++ {
			err := n.post(t.ctx, m.body)
			if t.ctx.Err() != nil {
				return // demoted: the message is dropped
			}
			if err == nil {
				n.onOK(m.service)
				break
			}
			n.log.Warn("webhook delivery failed", "service", m.service, "generation", m.gen, "attempt", attempt, "err", err)
			n.onErr(m.service, err, attempt)
			select {
			case <-t.ctx.Done():
				return
			case <-s.wake: // a newer state replaces the failing one
				m = n.take(s)
				backoff = 200 * time.Millisecond
				attempt = 0
				continue
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, seconds(n.cfg.MaxBackoffSeconds))
		}
		if n.idle(t, key, s) {
			return
		}
	}
}

// maxInFlight bounds the requests sent at once: a burst of changes (a
// snapshot's worth of Services created, say) queues behind them instead
// of opening a connection and a TLS handshake per Service, which would
// time out against the receiver and retry without end.
const maxInFlight = 16

// post sends body, signed now (each attempt afresh), once fewer than
// maxInFlight requests are in flight.
func (n *Notifier) post(ctx context.Context, body []byte) error {
	select {
	case n.inFlight <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-n.inFlight }()
	ctx, cancel := context.WithTimeout(ctx, seconds(n.cfg.TimeoutSeconds))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	SignRequest(n.secret, req.Header, body, time.Now())
	resp, err := n.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook %s answered %s", n.cfg.URL, resp.Status)
	}
	return nil
}

// Wait blocks until every delivery goroutine has ended (after the context
// given to Start or every term has ended).
func (n *Notifier) Wait() { n.wg.Wait() }

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
