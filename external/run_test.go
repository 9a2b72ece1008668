package external

import (
	"context"
	"testing"
)

// runHook runs h until the test ends, and fails the test if Run returns
// an error; the context returned ends with it.
func runHook(t *testing.T, h *Hook) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ctx
}
