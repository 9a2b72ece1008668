package pressure

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// apiProxy is a reverse proxy between one agent and kube-apiserver. It
// serves HTTPS (clientcmd sends no credentials over plain HTTP) with a
// certificate of its own on the loopback of the agent's node namespace,
// and dials the API server from that namespace, so the agent's requests take the path they
// would take without it. It passes requests through, or answers them
// itself as told: every request with one status (refuse), or watches from
// before a resource version with 410 Expired (compact). It records every
// request it saw.
type apiProxy struct {
	netns string
	addr  string // host:port on the namespace's loopback
	rp    *httputil.ReverseProxy
	cert  tls.Certificate
	caPEM []byte // cert, its own CA, for the agent's kubeconfig

	mu        sync.Mutex
	srv       *http.Server // nil while down
	answer    int          // status every request gets; 0: passed through
	compacted int64        // watches from a resource version below it get 410
	inflight  map[int]context.CancelFunc
	nextID    int
	seen      []apiRequest
}

// apiRequest is one request the proxy saw.
type apiRequest struct {
	At      time.Time
	Method  string
	Path    string
	Watch   bool   // watch=true
	Initial bool   // sendInitialEvents=true: a watch that streams a listing first
	RV      string // resourceVersion asked for
	Code    int    // the proxy's own answer; 0 when passed through
}

// startAPIProxy runs a proxy in node n's namespace in front of c's API
// server; it stops when t ends.
func startAPIProxy(t *testing.T, c *netns.Cluster, n *netns.Node) *apiProxy {
	t.Helper()
	upstream, err := url.Parse(c.CP.URL)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(c.CP.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		t.Fatalf("no certificate in %s", c.CP.CAFile())
	}
	p := &apiProxy{netns: n.Netns, inflight: map[int]context.CancelFunc{}}
	if p.cert, p.caPEM, err = loopbackCert(); err != nil {
		t.Fatal(err)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(upstream) },
		// Only the CA: the agent's own credentials (its bearer token) go
		// through unchanged, so the API server sees the agent.
		Transport: &http.Transport{
			DialContext:     nsutil.Dialer(n.Netns),
			TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		},
		FlushInterval: -1, // watch events as they come
		// Streams cut on purpose end with a copy error: not news.
		ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	ln, err := nsutil.Listen(n.Netns, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.down)
	return p
}

// URL is where the agent finds the proxy.
func (p *apiProxy) URL() string { return "https://" + p.addr }

func (p *apiProxy) serve(ln net.Listener) {
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{p.cert}, MinVersion: tls.VersionTLS12},
		ErrorLog:  slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	go func() { _ = srv.ServeTLS(ln, "", "") }()
}

// loopbackCert makes a certificate for 127.0.0.1 that is its own CA.
func loopbackCert() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "onehop pressure-test API proxy"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		IsCA:         true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// down stops listening and breaks every open request: the agent's next
// connection is refused, as by an API server that is not running.
func (p *apiProxy) down() {
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	p.cut()
}

// up listens again on the same address.
func (p *apiProxy) up(t *testing.T) {
	t.Helper()
	ln, err := nsutil.Listen(p.netns, "tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

// cut ends every request in flight, watches included: the agent has to
// make new ones.
func (p *apiProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cancel := range p.inflight {
		cancel()
	}
}

// refuse answers every request from now on with code (0: pass them).
func (p *apiProxy) refuse(code int) {
	p.mu.Lock()
	p.answer = code
	p.mu.Unlock()
}

// compact answers every watch that starts from a resource version below rv
// (without streaming a listing first) with 410 Expired, as kube-apiserver
// does once that version has left its watch cache and etcd's history.
func (p *apiProxy) compact(rv int64) {
	p.mu.Lock()
	p.compacted = rv
	p.mu.Unlock()
}

// requests returns what the proxy saw from since until until.
func (p *apiProxy) requests(since, until time.Time) []apiRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []apiRequest
	for _, r := range p.seen {
		if !r.At.Before(since) && r.At.Before(until) {
			out = append(out, r)
		}
	}
	return out
}

func (p *apiProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := apiRequest{At: time.Now(), Method: r.Method, Path: r.URL.Path, RV: q.Get("resourceVersion"),
		Watch: q.Get("watch") == "true" || q.Get("watch") == "1", Initial: q.Get("sendInitialEvents") == "true"}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	p.mu.Lock()
	compacted := p.compacted
	switch {
	case p.answer != 0:
		req.Code = p.answer
	case req.Watch && !req.Initial && below(req.RV, compacted):
		req.Code = http.StatusGone
	}
	p.seen = append(p.seen, req)
	id := p.nextID
	p.nextID++
	p.inflight[id] = cancel
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.inflight, id)
		p.mu.Unlock()
	}()

	switch req.Code {
	case 0:
		p.rp.ServeHTTP(w, r.WithContext(ctx))
	case http.StatusGone:
		// As the API server's watch cache: the watch starts (200), and
		// its one event is an ERROR carrying the 410.
		msg := fmt.Sprintf("too old resource version: %s (%d)", req.RV, compacted)
		writeWatchError(w, apierrors.NewResourceExpired(msg).ErrStatus)
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "1")
		writeStatus(w, apierrors.NewTooManyRequests("the API server is overloaded (test proxy)", 1).ErrStatus)
	default:
		st := apierrors.NewServiceUnavailable("the API server is unavailable (test proxy)").ErrStatus
		st.Code = int32(req.Code)
		writeStatus(w, st)
	}
}

// below reports whether resource version rv is set and older than floor.
func below(rv string, floor int64) bool {
	v, err := strconv.ParseInt(rv, 10, 64)
	return err == nil && v > 0 && v < floor
}

func withKind(st metav1.Status) metav1.Status {
	st.Kind, st.APIVersion = "Status", "v1"
	return st
}

func writeStatus(w http.ResponseWriter, st metav1.Status) {
	b, _ := json.Marshal(withKind(st))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(b)
}

func writeWatchError(w http.ResponseWriter, st metav1.Status) {
	b, _ := json.Marshal(struct {
		Type   string        `json:"type"`
		Object metav1.Status `json:"object"`
	}{"ERROR", withKind(st)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}
