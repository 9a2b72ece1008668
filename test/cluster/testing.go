package cluster

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// StartTest runs a control plane for t in a fresh network namespace, bound
// to address on that namespace's loopback, and returns it with the
// namespace's name. It skips t where network namespaces are unavailable;
// the control plane and the namespace go when t ends.
func StartTest(t testing.TB, suffix, address string) (*ControlPlane, string) {
	t.Helper()
	if err := nsutil.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	name := nsutil.RunID() + "-" + suffix
	if err := nsutil.Create(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsutil.Delete(context.Background(), name) })
	if err := nsutil.IP(ctx, name, "addr", "add", address+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	cp, err := Start(ctx, Options{Netns: name, Address: address, Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	return cp, name
}
