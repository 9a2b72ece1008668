package webhook

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// receiver records verified calls on loopback over https; it fails the
// first `fail` ones, and while block is set holds each request until the
// sender gives up on it.
type receiver struct {
	mu       sync.Mutex
	calls    []call
	mirror   *Mirror
	fail     atomic.Int32
	bad      atomic.Int32 // requests VerifyRequest refused
	attempts atomic.Int32
	block    atomic.Bool
	aborted  chan struct{} // a blocked request's context ended
}

type call struct {
	snapshot bool
	gen      uint64
	body     []byte
}

func newReceiver() *receiver { return &receiver{mirror: NewMirror(), aborted: make(chan struct{}, 16)} }

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	if err := VerifyRequest([]byte("s3cret"), req.Header, body, time.Now(), DefaultMaxAge); err != nil {
		r.bad.Add(1)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	r.attempts.Add(1)
	if r.block.Load() {
		<-req.Context().Done()
		r.aborted <- struct{}{}
		return
	}
	if r.fail.Add(-1) >= 0 {
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	var c call
	var s Snapshot
	if err := jsonUnmarshal(body, &s); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.snapshot, c.gen, c.body = s.Snapshot, s.Generation, body
	if _, err := r.mirror.Apply(body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

func (r *receiver) waitCalls(t *testing.T, n int) []call {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		c := append([]call(nil), r.calls...)
		r.mu.Unlock()
		if len(c) >= n {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("receiver got fewer than %d calls", n)
	return nil
}

// waitMirror waits until the receiver's Mirror holds exactly want
// (service -> first node name, "" for no nodes).
func (r *receiver) waitMirror(t *testing.T, want map[string]string) {
	t.Helper()
	var got map[string]string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		got = map[string]string{}
		for _, p := range r.mirror.Services() {
			got[p.Service] = ""
			if len(p.Nodes) > 0 {
				got[p.Service] = p.Nodes[0].Name
			}
		}
		if equalMaps(got, want) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("receiver holds %v, want %v", got, want)
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// tlsReceiver serves r over https on loopback and returns a Config that
// trusts its certificate.
func tlsReceiver(t *testing.T, r http.Handler) Config {
	t.Helper()
	srv := httptest.NewTLSServer(r)
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return Config{URL: srv.URL, CAFile: ca, Secret: "s3cret", MaxBackoffSeconds: 0.2}
}

// leading returns a Notifier to rcv that leads term.
func leading(t *testing.T, rcv *receiver, term uint64) *Notifier {
	t.Helper()
	n, err := New(tlsReceiver(t, rcv), slog.Default(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Lead(t.Context(), term); err != nil {
		t.Fatal(err)
	}
	return n
}

func svc(name, node string) Payload {
	return Payload{Service: name, IPs: []string{"192.0.2.1"}, Ports: []Port{{80, "TCP"}},
		Nodes: []Node{{Name: node, Addresses: []string{"10.0.0.11"}}}}
}

func TestNotifierSignsRetriesAndFollowsChanges(t *testing.T) {
	rcv := newReceiver()
	rcv.fail.Store(2)
	var errs atomic.Int32
	n, err := New(tlsReceiver(t, rcv), slog.Default(), func(string, error, int) { errs.Add(1) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	n.Start(ctx)
	st := svc("ns/web", "a")
	n.Set([]Payload{st}) // not leading: nothing is sent
	if err := n.Lead(ctx, 3); err != nil {
		t.Fatal(err)
	}
	n.Set([]Payload{st})
	n.Set([]Payload{st}) // unchanged: not sent again
	c := rcv.waitCalls(t, 1)
	if errs.Load() != 2 || !c[0].snapshot || TermOf(c[0].gen) != 3 {
		t.Fatalf("after two failures: errors %d, first call %s (generation %d)", errs.Load(), c[0].body, c[0].gen)
	}
	rcv.waitMirror(t, map[string]string{"ns/web": "a"})
	st.Nodes = []Node{{Name: "b", Addresses: []string{"10.0.0.12"}}} // the endpoint moved
	n.Set([]Payload{st})
	c = rcv.waitCalls(t, 2)
	if c[1].snapshot || c[1].gen <= c[0].gen {
		t.Fatalf("endpoint move: %s after generation %d", c[1].body, c[0].gen)
	}
	rcv.waitMirror(t, map[string]string{"ns/web": "b"})
	n.Set(nil) // Service gone
	c = rcv.waitCalls(t, 3)
	if !strings.Contains(string(c[2].body), `"deleted":true`) || c[2].gen <= c[1].gen {
		t.Fatalf("deletion: %s", c[2].body)
	}
	rcv.waitMirror(t, map[string]string{})
	if rcv.bad.Load() != 0 {
		t.Fatalf("%d requests failed verification", rcv.bad.Load())
	}
}

// TestNewLeaderSnapshotReconciles: a Service deleted while leadership
// moves is never sent as deleted by anyone; the new leader's snapshot,
// generations above the old leader's, makes the receiver drop it, and the
// old leader's late message changes nothing.
func TestNewLeaderSnapshotReconciles(t *testing.T) {
	rcv := newReceiver()
	cfg := tlsReceiver(t, rcv)
	ctx := t.Context()
	old, err := New(cfg, slog.Default(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Lead(ctx, 7); err != nil {
		t.Fatal(err)
	}
	old.Set([]Payload{svc("ns/a", "n1"), svc("ns/gone", "n1")})
	old.Set([]Payload{svc("ns/a", "n2"), svc("ns/gone", "n1")})
	c := rcv.waitCalls(t, 2)
	rcv.waitMirror(t, map[string]string{"ns/a": "n2", "ns/gone": "n1"})
	oldMax := max(c[0].gen, c[1].gen)
	old.Demote()

	// ns/gone is deleted during the hand-over; ns/new appears.
	nw, err := New(cfg, slog.Default(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := nw.Lead(ctx, 8); err != nil {
		t.Fatal(err)
	}
	nw.Set([]Payload{svc("ns/a", "n2"), svc("ns/new", "n3")})
	c = rcv.waitCalls(t, 3)
	if !c[2].snapshot || c[2].gen <= oldMax {
		t.Fatalf("new leader's first call %s: want a snapshot with a generation above %d", c[2].body, oldMax)
	}
	rcv.waitMirror(t, map[string]string{"ns/a": "n2", "ns/new": "n3"})
	// The old leader's last state arrives late (a retry in flight).
	if ch, _ := rcv.mirror.Apply(c[1].body); len(ch) != 0 {
		t.Fatalf("a late message of the old term changed %v", ch)
	}
	rcv.waitMirror(t, map[string]string{"ns/a": "n2", "ns/new": "n3"})
	nw.Set([]Payload{svc("ns/a", "n2")})
	rcv.waitMirror(t, map[string]string{"ns/a": "n2"})
}

// TestDemoteDropsRetries: a demoted leader aborts its request in flight,
// ends its retries at once and sends nothing more.
func TestDemoteDropsRetries(t *testing.T) {
	rcv := newReceiver()
	rcv.fail.Store(1 << 30)
	n := leading(t, rcv, 1)
	n.Set([]Payload{svc("ns/a", "n1")})
	n.Set([]Payload{svc("ns/a", "n1"), svc("ns/b", "n1")})
	for rcv.attempts.Load() < 4 { // retrying
		time.Sleep(10 * time.Millisecond)
	}
	rcv.block.Store(true) // the next attempt hangs until the sender gives up
	select {
	case <-rcv.aborted:
		t.Fatal("a request was aborted before the demotion")
	case <-time.After(500 * time.Millisecond):
	}
	n.Demote()
	select {
	case <-rcv.aborted:
	case <-time.After(10 * time.Second):
		t.Fatal("the request in flight was not aborted by the demotion")
	}
	done := make(chan struct{})
	go func() { n.Wait(); close(done) }()
	select {
	case <-done: // every delivery goroutine of the term has ended
	case <-time.After(10 * time.Second):
		t.Fatal("retries go on after the demotion")
	}
	before := rcv.attempts.Load()
	n.Set([]Payload{svc("ns/c", "n1")})
	n.Wait()
	if got := rcv.attempts.Load(); got != before {
		t.Fatalf("%d requests sent after the demotion", got-before)
	}
}

func TestLeadNeedsAGrowingTerm(t *testing.T) {
	n, err := New(Config{URL: "https://127.0.0.1:1", Secret: "x"}, slog.Default(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, tc := range []struct {
		term uint64
		ok   bool
	}{{0, false}, {2, true}, {2, false}, {1, false}, {3, true}, {maxTerm + 1, false}} {
		if err := n.Lead(ctx, tc.term); (err == nil) != tc.ok {
			t.Errorf("Lead(%d): %v", tc.term, err)
		}
	}
	n.Demote()
	n.Wait()
}

// TestSpentTermStops: a term whose counter is spent sends nothing more,
// rather than reuse a later term's generations.
func TestSpentTermStops(t *testing.T) {
	rcv := newReceiver()
	n, err := New(tlsReceiver(t, rcv), slog.Default(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Lead(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	n.Set([]Payload{svc("ns/a", "n1")})
	rcv.waitCalls(t, 1)
	n.mu.Lock()
	n.term.count = maxCount - 1
	n.mu.Unlock()
	n.Set([]Payload{svc("ns/a", "n2")})
	c := rcv.waitCalls(t, 2)
	if c[1].gen != Generation(1, maxCount) || c[1].gen >= Generation(2, 0) {
		t.Fatalf("last generation of term 1: %d", c[1].gen)
	}
	n.Set([]Payload{svc("ns/a", "n3")})
	n.Wait() // the term has ended: its goroutines are gone
	if got := len(rcv.waitCalls(t, 2)); got != 2 {
		t.Fatalf("%d calls after the counter was spent", got)
	}
}

func TestNewChecksURLAndSecret(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string // "" for accepted
	}{
		{Config{Secret: "x"}, "url is required"},
		{Config{URL: "https://lb.example/onehop"}, "secret"},
		{Config{URL: "http://127.0.0.1:1/x", Secret: "x"}, "allowInsecureHTTP: true"},
		{Config{URL: "http://127.0.0.1:1/x", Secret: "x", AllowInsecureHTTP: true}, ""},
		{Config{URL: "ftp://lb.example/x", Secret: "x", AllowInsecureHTTP: true}, "scheme must be https"},
		{Config{URL: "https:///x", Secret: "x"}, "no host"},
		{Config{URL: "https://lb.example/x", Secret: "x"}, ""},
		{Config{URL: "https://lb.example/x", Secret: "x", CAFile: "/nonexistent/ca.pem"}, "caFile"},
		{Config{URL: "https://lb.example/x", Secret: "x", CA: []byte("no certificate")}, "the CA bundle holds no PEM certificate"},
	} {
		_, err := New(tc.cfg, slog.Default(), nil, nil)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
		// Check refuses the same, but for the file it does not read.
		if err := tc.cfg.Check(); tc.cfg.CAFile == "" && (err == nil) != (tc.want == "") {
			t.Errorf("%+v: Check: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestPlainHTTPRefusedUnlessAllowed: with AllowInsecureHTTP the same
// notifier delivers over http; an https URL does not fall back to http.
func TestPlainHTTPRefusedUnlessAllowed(t *testing.T) {
	rcv := newReceiver()
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	https := "https://" + strings.TrimPrefix(srv.URL, "http://")
	var lastErr atomic.Value
	n, err := New(Config{URL: https, Secret: "s3cret", MaxBackoffSeconds: 0.2}, slog.Default(),
		func(_ string, err error, _ int) { lastErr.Store(err) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	if err := n.Lead(ctx, 1); err != nil {
		t.Fatal(err)
	}
	n.Set([]Payload{svc("ns/a", "n1")})
	for lastErr.Load() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	n.Wait()
	if rcv.attempts.Load() != 0 {
		t.Fatalf("https to a plain http server delivered %d requests", rcv.attempts.Load())
	}
	n, err = New(Config{URL: srv.URL, Secret: "s3cret", AllowInsecureHTTP: true}, slog.Default(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Lead(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	n.Set([]Payload{svc("ns/a", "n1")})
	rcv.waitMirror(t, map[string]string{"ns/a": "n1"})
}

func TestVerifyRequest(t *testing.T) {
	secret, body := []byte("k"), []byte(`{"service":"ns/a","generation":5}`)
	signed := time.Unix(1_800_000_000, 0)
	h := http.Header{}
	SignRequest(secret, h, body, signed)
	check := func(what string, secret []byte, h http.Header, body []byte, now time.Time, want error) {
		t.Helper()
		err := VerifyRequest(secret, h, body, now, time.Minute)
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	check("fresh", secret, h, body, signed.Add(30*time.Second), nil)
	check("receiver's clock behind", secret, h, body, signed.Add(-30*time.Second), nil)
	check("tampered body", secret, h, []byte(`{"service":"ns/a","generation":6}`), signed, ErrBadSignature)
	check("wrong secret", []byte("x"), h, body, signed, ErrBadSignature)
	moved := h.Clone()
	moved.Set(TimestampHeader, "1800000600") // a captured request re-dated
	check("re-dated", secret, moved, body, signed.Add(10*time.Minute), ErrBadSignature)
	check("no timestamp", secret, http.Header{SignatureHeader: h[SignatureHeader]}, body, signed, ErrBadSignature)
	check("replayed after the window", secret, h, body, signed.Add(61*time.Second), ErrStale)
	check("from the future", secret, h, body, signed.Add(-61*time.Second), ErrStale)
	if err := VerifyRequest(secret, h, body, signed.Add(4*time.Minute), 0); err != nil {
		t.Errorf("default window: %v", err)
	}
	if err := VerifyRequest(secret, h, body, signed.Add(DefaultMaxAge+time.Second), 0); !errors.Is(err, ErrStale) {
		t.Errorf("past the default window: %v", err)
	}
}

// TestReplayRejected: a delivered request sent again is refused once it is
// older than the window, and within the window changes nothing.
func TestReplayRejected(t *testing.T) {
	type captured struct {
		h    http.Header
		body []byte
	}
	var mu sync.Mutex
	var got []captured
	mirror := NewMirror()
	var now atomic.Int64 // the receiver's clock, Unix seconds; 0 = real time
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		clock := time.Now()
		if s := now.Load(); s != 0 {
			clock = time.Unix(s, 0)
		}
		if err := VerifyRequest([]byte("s3cret"), r.Header, body, clock, time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if _, err := mirror.Apply(body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, captured{r.Header.Clone(), body})
		mu.Unlock()
	}))
	defer srv.Close()
	cfg := Config{URL: srv.URL, Secret: "s3cret"}
	n, err := New(cfg, slog.Default(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.http = srv.Client()
	if err := n.Lead(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	n.Set([]Payload{svc("ns/a", "n1")})
	n.Set([]Payload{svc("ns/a", "n2")})
	for {
		mu.Lock()
		l := len(got)
		mu.Unlock()
		if l == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	replay := func(c captured) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(string(c.body)))
		req.Header = c.h.Clone()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Within the window the replay of the first state is accepted but stale.
	if code := replay(got[0]); code != http.StatusOK {
		t.Fatalf("replay within the window: %d", code)
	}
	if p, _ := mirror.Service("ns/a"); p.Nodes[0].Name != "n2" {
		t.Fatalf("a replay within the window rolled the state back to %+v", p)
	}
	now.Store(time.Now().Add(2 * time.Minute).Unix())
	if code := replay(got[1]); code != http.StatusUnauthorized {
		t.Fatalf("replay after the window: %d, want 401", code)
	}
}

// TestTermForgetsDeletedServices: 20,000 Services sent and then deleted,
// in one term, leave no goroutine and no entry of theirs behind: a term
// holds a delivery goroutine per Service with a message pending or in
// flight, and remembers only the Services that exist.
func TestTermForgetsDeletedServices(t *testing.T) {
	const services = 20000
	rcv := newReceiver()
	n := leading(t, rcv, 1)
	n.Set(nil) // the snapshot, empty
	rcv.waitCalls(t, 1)
	base := runtime.NumGoroutine()
	for i := range services / 1000 {
		states := make([]Payload, 0, 1000)
		for j := range 1000 {
			states = append(states, svc(fmt.Sprintf("ns/s%d", i*1000+j), "a"))
		}
		n.Set(states) // a thousand created
		n.Set(nil)    // and deleted
	}
	held := func() (slots, last int) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return len(n.term.slots), len(n.term.last)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		slots, last := held()
		g := runtime.NumGoroutine()
		if slots == 0 && last == 0 && g <= base+5 {
			t.Logf("%d Services created and deleted: %d calls received; goroutines %d (%d before)", services, len(rcv.calls), g, base)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Services created and deleted: the term holds %d deliveries and %d Services, %d goroutines (%d before)", services, slots, last, g, base)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rcv.waitMirror(t, map[string]string{})
	// The term still sends: a Service created now reaches the receiver.
	n.Set([]Payload{svc("ns/late", "b")})
	rcv.waitMirror(t, map[string]string{"ns/late": "b"})
}
