package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// SignatureHeader carries "sha256=<hex HMAC-SHA256 of the body>" keyed with
// the shared secret.
const SignatureHeader = "X-Onehop-Signature-256"

// Config configures the webhook provider.
type Config struct {
	URL string `json:"url"`
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

// Payload is the body of one POST: the complete desired state of one
// Service. A Service that no longer has external IPs is sent once with
// empty IPs and Nodes and Deleted set.
type Payload struct {
	Service             string   `json:"service"`
	IPs                 []string `json:"ips"`
	Ports               []Port   `json:"ports"`
	HealthCheckNodePort uint16   `json:"healthCheckNodePort,omitempty"`
	Nodes               []Node   `json:"nodes"`
	Deleted             bool     `json:"deleted,omitempty"`
	// Generation increases with every change the agent sends, so that a
	// receiver can drop a retry that arrives after a newer state.
	Generation uint64 `json:"generation"`
}

// Sign returns the signature header value for body.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Verify checks a signature header value in constant time.
func Verify(secret, body []byte, header string) bool {
	return hmac.Equal([]byte(Sign(secret, body)), []byte(header))
}

// Notifier sends payloads. Set replaces the desired state; one goroutine per
// Service delivers the newest state, retrying failures with back-off.
type Notifier struct {
	cfg    Config
	secret []byte
	http   *http.Client
	log    *slog.Logger
	onErr  func(service string, err error, attempt int)
	onOK   func(service string)

	mu    sync.Mutex
	gen   uint64
	last  map[string]string // service -> canonical JSON of what was sent/queued (without generation)
	slots map[string]*slot
	wg    sync.WaitGroup
	ctx   context.Context
}

type slot struct {
	wake    chan struct{}
	pending *Payload
}

// New returns a Notifier. onErr (may be nil) is told about every failed
// attempt, onOK about every delivered payload.
func New(cfg Config, log *slog.Logger, onErr func(service string, err error, attempt int), onOK func(service string)) (*Notifier, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("webhook: url is required")
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
	if onErr == nil {
		onErr = func(string, error, int) {}
	}
	if onOK == nil {
		onOK = func(string) {}
	}
	return &Notifier{cfg: cfg, secret: secret, http: &http.Client{Timeout: seconds(cfg.TimeoutSeconds)}, log: log,
		onErr: onErr, onOK: onOK, last: map[string]string{}, slots: map[string]*slot{}, ctx: context.Background()}, nil
}

// Start binds the delivery goroutines to ctx; call once before Set.
func (n *Notifier) Start(ctx context.Context) { n.ctx = ctx }

// Set makes states the desired state of every Service: changed ones are
// sent, Services missing from states are sent once as deleted.
func (n *Notifier) Set(states []Payload) {
	n.mu.Lock()
	defer n.mu.Unlock()
	seen := map[string]bool{}
	for _, p := range states {
		seen[p.Service] = true
		n.queue(p)
	}
	for svc, c := range n.last {
		if !seen[svc] && c != "deleted" {
			n.queue(Payload{Service: svc, IPs: []string{}, Ports: []Port{}, Nodes: []Node{}, Deleted: true})
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

// queue: caller holds n.mu.
func (n *Notifier) queue(p Payload) {
	c := canonical(p)
	if n.last[p.Service] == c {
		return
	}
	n.last[p.Service] = c
	n.gen++
	p.Generation = n.gen
	s := n.slots[p.Service]
	if s == nil {
		s = &slot{wake: make(chan struct{}, 1)}
		n.slots[p.Service] = s
		n.wg.Add(1)
		go n.deliver(p.Service, s)
	}
	s.pending = &p
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (n *Notifier) take(s *slot) *Payload {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := s.pending
	s.pending = nil
	return p
}

func (n *Notifier) deliver(svc string, s *slot) {
	defer n.wg.Done()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-s.wake:
		}
		p := n.take(s)
		backoff := 200 * time.Millisecond
		for attempt := 1; p != nil; attempt++ {
			err := n.post(p)
			if err == nil {
				n.onOK(svc)
				break
			}
			n.log.Warn("webhook delivery failed", "service", svc, "attempt", attempt, "err", err)
			n.onErr(svc, err, attempt)
			select {
			case <-n.ctx.Done():
				return
			case <-s.wake: // a newer state replaces the failing one
				p = n.take(s)
				backoff = 200 * time.Millisecond
				attempt = 0
				continue
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, seconds(n.cfg.MaxBackoffSeconds))
		}
	}
}

func (n *Notifier) post(p *Payload) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(n.ctx, seconds(n.cfg.TimeoutSeconds))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign(n.secret, body))
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

// Wait blocks until every delivery goroutine has ended (after ctx ends).
func (n *Notifier) Wait() { n.wg.Wait() }

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
