package dataplane

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// testNS is a throwaway network namespace, deleted when the test ends.
type testNS struct {
	name   string
	handle netns.NsHandle
}

// newTestNS creates a uniquely named network namespace, or skips the test
// when this machine cannot (not root, no ip binary).
func newTestNS(t *testing.T) *testNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("needs ip (Debian: iproute2): %v", err)
	}
	rnd := make([]byte, 4)
	_, _ = rand.Read(rnd)
	name := fmt.Sprintf("onehop-dp-%d-%s", os.Getpid(), hex.EncodeToString(rnd))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("delete netns %s: %v: %s", name, err, out)
		}
	})
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return &testNS{name: name, handle: h}
}

// run runs a command in the namespace, failing the test on error.
func (n *testNS) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// do runs fn on a thread switched into the namespace. The thread is never
// handed back to the runtime (the goroutine exits locked), and fn does not
// run unless the switch is proven.
func (n *testNS) do(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		orig, err := netns.Get()
		if err != nil {
			t.Errorf("current netns: %v", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(n.handle); err != nil {
			t.Errorf("setns: %v", err)
			return
		}
		cur, err := netns.Get()
		if err != nil {
			t.Errorf("current netns after setns: %v", err)
			return
		}
		defer cur.Close()
		if !cur.Equal(n.handle) || cur.Equal(orig) {
			t.Errorf("thread is not in the test namespace; not running")
			return
		}
		fn()
	}()
	<-done
}
