package external

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needs skips the test unless it runs as root with the named tools.
func needs(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s on PATH (Debian: apt-get install %s)", tool, map[string]string{"bird": "bird2", "nft": "nftables", "ip": "iproute2"}[tool])
		}
	}
}

// run runs a command and fails the test on error.
func run(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// topo is a set of namespaces with a unique prefix, removed at cleanup.
type topo struct {
	t      *testing.T
	prefix string
}

func newTopo(t *testing.T) *topo {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	tp := &topo{t: t, prefix: "ohx" + hex.EncodeToString(b) + "-"}
	return tp
}

func (tp *topo) name(n string) string { return tp.prefix + n }

func (tp *topo) add(names ...string) {
	for _, n := range names {
		full := tp.name(n)
		run(tp.t, "ip", "netns", "add", full)
		tp.t.Cleanup(func() {
			// Kill whatever still runs in the namespace, then delete it.
			if out, err := exec.Command("ip", "netns", "pids", full).Output(); err == nil {
				for _, p := range strings.Fields(string(out)) {
					_ = exec.Command("kill", "-KILL", p).Run()
				}
			}
			_ = exec.Command("ip", "netns", "del", full).Run()
		})
		tp.ip(n, "link", "set", "lo", "up")
	}
}

// ip runs `ip -n <ns> args...`.
func (tp *topo) ip(n string, args ...string) string {
	return run(tp.t, append([]string{"ip", "-n", tp.name(n)}, args...)...)
}

// exec runs argv inside namespace n.
func (tp *topo) exec(n string, argv ...string) string {
	return run(tp.t, append([]string{"ip", "netns", "exec", tp.name(n)}, argv...)...)
}

// veth connects namespace a (interface an) and b (interface bn).
func (tp *topo) veth(a, an, b, bn string) {
	tp.ip(a, "link", "add", an, "type", "veth", "peer", "name", bn, "netns", tp.name(b))
	tp.ip(a, "link", "set", an, "up")
	tp.ip(b, "link", "set", bn, "up")
}

// do runs fn on a thread inside namespace n; sockets fn opens stay there.
func (tp *topo) do(n string, fn func() error) error {
	target, err := os.Open(filepath.Join("/run/netns", tp.name(n)))
	if err != nil {
		return err
	}
	defer target.Close()
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return err // thread stays locked and dies with the goroutine
	}
	runtime.UnlockOSThread()
	return ferr
}

// serve answers every TCP connection to addr in namespace n with reply.
func (tp *topo) serve(n, addr, reply string) {
	var ln net.Listener
	if err := tp.do(n, func() (err error) { ln, err = net.Listen("tcp", addr); return }); err != nil {
		tp.t.Fatal(err)
	}
	tp.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(reply))
			c.Close()
		}
	}()
}

// get connects from namespace n to addr and returns what it reads.
func (tp *topo) get(n, addr string) (string, error) {
	var c net.Conn
	err := tp.do(n, func() (err error) {
		c, err = (&net.Dialer{Timeout: 2 * time.Second}).Dial("tcp", addr)
		return
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b bytes.Buffer
	_, err = b.ReadFrom(c)
	return b.String(), err
}

// waitFor polls cond every 5 ms until it holds or timeout passes, and
// returns how long it took.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) (time.Duration, bool) {
	t0 := time.Now()
	for time.Since(t0) < timeout && ctx.Err() == nil {
		if cond() {
			return time.Since(t0), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(t0), cond()
}

func netip4(s string) netip.Addr { return netip.MustParseAddr(s) }
