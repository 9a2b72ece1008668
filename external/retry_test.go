package external

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// flaky fails its first fails updates.
type flaky struct {
	mu    sync.Mutex
	fails int
	calls int
}

func (p *flaky) Name() string { return "flaky" }

func (p *flaky) Update(context.Context, *State) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls <= p.fails {
		return errors.New("router unreachable")
	}
	return nil
}

func (p *flaky) Close(context.Context) error { return nil }

func (p *flaky) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// A provider whose update fails is told the same state again after a
// back-off, although nothing changed, until it takes it; then it is left
// alone, and a provider that took the state is not told it again.
func TestFailedProviderUpdateIsRetried(t *testing.T) {
	h, err := New(Config{LeaseNamespace: "default"}, fake.NewClientset(), "node1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	bad, good := &flaky{fails: 2}, &flaky{}
	h.AddProvider(bad)
	h.AddProvider(good)
	runHook(t, h)
	deadline := time.Now().Add(15 * time.Second)
	for bad.count() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the failing provider was told %d times, want a third (successful) try without any change", bad.count())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2500 * time.Millisecond) // longer than the next back-off
	if n := bad.count(); n != 3 {
		t.Errorf("the provider was told %d times; after its success it should be left alone (3)", n)
	}
	if n := good.count(); n != 1 {
		t.Errorf("the provider that took the state was told %d times, want 1", n)
	}
}
