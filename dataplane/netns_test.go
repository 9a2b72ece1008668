package dataplane

import (
	"testing"

	"github.com/vishvananda/netns"

	"github.com/onehop/onehop/test/nsutil"
)

// testNS is a throwaway network namespace from test/nsutil, deleted with
// what runs in it when the test ends.
type testNS struct {
	*nsutil.NS
	handle netns.NsHandle
}

// newTestNS creates a uniquely named network namespace, or skips the test
// when this machine cannot (not root, no ip binary).
func newTestNS(t *testing.T) *testNS {
	t.Helper()
	n := nsutil.New(t, "ohdp-")
	return &testNS{NS: n, handle: netns.NsHandle(n.FD())}
}

// run runs a command in the namespace, failing the test on error.
func (n *testNS) run(t *testing.T, args ...string) string {
	t.Helper()
	return n.Run(t, args...)
}

// do runs fn on a thread switched into the namespace; fn does not run
// unless the switch is proven.
func (n *testNS) do(t *testing.T, fn func()) {
	t.Helper()
	if err := n.Do(func() error { fn(); return nil }); err != nil {
		t.Error(err)
	}
}
