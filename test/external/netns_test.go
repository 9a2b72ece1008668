package external

import (
	"context"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// needs skips the test unless network namespaces are usable and the named
// tools are on PATH.
func needs(t *testing.T, tools ...string) {
	t.Helper()
	nsutil.RequireRoot(t)
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s on PATH (Debian: apt-get install %s)", tool, map[string]string{"bird": "bird2", "nft": "nftables"}[tool])
		}
	}
}

// topo names a test's namespaces by role ("router", "node1", ...); each is
// an nsutil namespace, deleted with what runs in it when the test ends.
type topo struct {
	t  *testing.T
	ns map[string]*nsutil.NS
}

func newTopo(t *testing.T) *topo { return &topo{t: t, ns: map[string]*nsutil.NS{}} }

// at returns the namespace of role n, which add must have made.
func (tp *topo) at(n string) *nsutil.NS {
	tp.t.Helper()
	ns, ok := tp.ns[n]
	if !ok {
		tp.t.Fatalf("no namespace %q in this topology", n)
	}
	return ns
}

// name is the kernel's name of the namespace of role n.
func (tp *topo) name(n string) string { return tp.at(n).Name }

func (tp *topo) add(names ...string) {
	for _, n := range names {
		tp.ns[n] = nsutil.New(tp.t, "ohx-"+n)
	}
}

// ip runs `ip -n <ns> args...`.
func (tp *topo) ip(n string, args ...string) string { return tp.at(n).IP(tp.t, args...) }

// exec runs argv inside namespace n.
func (tp *topo) exec(n string, argv ...string) string { return tp.at(n).Run(tp.t, argv...) }

// command returns a command running argv inside namespace n.
func (tp *topo) command(n string, argv ...string) *exec.Cmd { return tp.at(n).Command(argv...) }

// veth connects namespace a (interface an) and b (interface bn), both up.
func (tp *topo) veth(a, an, b, bn string) { nsutil.Veth(tp.t, tp.at(a), an, nil, tp.at(b), bn, nil) }

// serve runs an echo server answering as reply on addr in namespace n.
func (tp *topo) serve(n, addr, reply string) { tp.at(n).Echo(tp.t, reply, addr) }

// get sends one TCP request from namespace n to an echo server at addr and
// returns the server's name.
func (tp *topo) get(n, addr string) (string, error) {
	r, err := tp.at(n).Ask("tcp", addr, 2*time.Second)
	return r.Name, err
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
