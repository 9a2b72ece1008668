package webhook

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// receiver records signed calls on loopback; it fails the first `fail` ones.
type receiver struct {
	mu    sync.Mutex
	calls []Payload
	fail  atomic.Int32
	bad   atomic.Int32 // bad signatures seen
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	if !Verify([]byte("s3cret"), body, req.Header.Get(SignatureHeader)) {
		r.bad.Add(1)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	if r.fail.Add(-1) >= 0 {
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	var p Payload
	if err := json.Unmarshal(body, &p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.calls = append(r.calls, p)
	r.mu.Unlock()
}

func (r *receiver) last(t *testing.T, n int) []Payload {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		c := append([]Payload(nil), r.calls...)
		r.mu.Unlock()
		if len(c) >= n {
			return c
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("receiver got fewer than %d calls", n)
	return nil
}

func TestNotifierSignsRetriesAndFollowsChanges(t *testing.T) {
	rcv := &receiver{}
	rcv.fail.Store(2)
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	var errs atomic.Int32
	n, err := New(Config{URL: srv.URL, Secret: "s3cret", MaxBackoffSeconds: 0.5}, slog.Default(),
		func(string, error, int) { errs.Add(1) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	n.Start(ctx)
	st := Payload{Service: "ns/web", IPs: []string{"192.0.2.1"}, Ports: []Port{{80, "TCP"}},
		Nodes: []Node{{Name: "a", Addresses: []string{"10.0.0.11"}}}}
	n.Set([]Payload{st})
	n.Set([]Payload{st}) // unchanged: not sent again
	c := rcv.last(t, 1)
	if errs.Load() != 2 || c[0].Nodes[0].Name != "a" || c[0].Generation == 0 {
		t.Fatalf("after two failures: errors %d, call %+v", errs.Load(), c[0])
	}
	st.Nodes = []Node{{Name: "b", Addresses: []string{"10.0.0.12"}}} // the endpoint moved
	n.Set([]Payload{st})
	c = rcv.last(t, 2)
	if c[1].Nodes[0].Name != "b" || c[1].Generation <= c[0].Generation {
		t.Fatalf("endpoint move: %+v", c[1])
	}
	n.Set(nil) // Service gone
	c = rcv.last(t, 3)
	if !c[2].Deleted || len(c[2].IPs) != 0 || c[2].Service != "ns/web" {
		t.Fatalf("deletion: %+v", c[2])
	}
	time.Sleep(100 * time.Millisecond)
	if len(rcv.last(t, 3)) != 3 || rcv.bad.Load() != 0 {
		t.Fatalf("extra calls or bad signatures: %d calls, %d bad", len(rcv.last(t, 3)), rcv.bad.Load())
	}
}

func TestVerifyRejectsTampering(t *testing.T) {
	sig := Sign([]byte("k"), []byte(`{"a":1}`))
	if !Verify([]byte("k"), []byte(`{"a":1}`), sig) || Verify([]byte("k"), []byte(`{"a":2}`), sig) || Verify([]byte("x"), []byte(`{"a":1}`), sig) {
		t.Fatal("signature check broken")
	}
}

func TestNewNeedsURLAndSecret(t *testing.T) {
	if _, err := New(Config{Secret: "x"}, slog.Default(), nil, nil); err == nil {
		t.Error("no URL accepted")
	}
	if _, err := New(Config{URL: "http://127.0.0.1:1"}, slog.Default(), nil, nil); err == nil {
		t.Error("no secret accepted")
	}
}
