package external

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/external/bgp"
	"github.com/onehop/onehop/external/l2"
)

// TestMain doubles as the speaker process: a test re-executes its own
// binary inside a node's namespace with OHX_SPEAKER set, so that GoBGP's
// sockets live in that namespace (a namespace is per thread; GoBGP's
// goroutines are not).
func TestMain(m *testing.M) {
	if cfg := os.Getenv("OHX_SPEAKER"); cfg != "" {
		os.Exit(speakerMain(cfg, os.Getenv("OHX_NEXTHOP")))
	}
	if cfg := os.Getenv("OHX_HOOK"); cfg != "" {
		os.Exit(hookMain(cfg, os.Getenv("OHX_KUBECONFIG"), os.Getenv("OHX_NODE")))
	}
	if iface := os.Getenv("OHX_L2"); iface != "" {
		os.Exit(responderMain(iface))
	}
	os.Exit(m.Run())
}

// speakerMain reads commands from stdin: "set ip,ip" and "stop"; it
// answers each with "ok" or "err ..." on stdout.
func speakerMain(cfgJSON, nexthop string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var cfg bgp.Config
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Println("err", err)
		return 2
	}
	sp, err := bgp.NewSpeaker(cfg, parseIPs(nexthop), log)
	if err == nil {
		err = sp.Start(context.Background())
	}
	if err != nil {
		fmt.Println("err", err)
		return 2
	}
	fmt.Println("ok")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "set":
			reply(sp.Set(parseIPs(arg)))
		case "learned":
			fmt.Println(learnedLine(sp))
		case "stop":
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			reply(sp.Stop(ctx))
			cancel()
			return 0
		}
	}
	return 0
}

// responderMain answers ARP/NDP on iface; commands as speakerMain.
func responderMain(iface string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	r, err := l2.NewResponder([]string{iface}, log)
	if err != nil {
		fmt.Println("err", err)
		return 2
	}
	fmt.Println("ok")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "set":
			r.Set(parseIPs(arg))
			reply(nil)
		case "stop":
			r.Close()
			reply(nil)
			return 0
		}
	}
	return 0
}

func parseIPs(arg string) []netip.Addr {
	var ips []netip.Addr
	for _, s := range strings.Split(arg, ",") {
		if s != "" {
			ips = append(ips, netip.MustParseAddr(s))
		}
	}
	return ips
}

func reply(err error) {
	if err != nil {
		fmt.Println("err", err)
		return
	}
	fmt.Println("ok")
}

// speaker is a running speaker process.
type speaker struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *strings.Builder
}

// startSpeaker starts a speaker in namespace n; nexthop is one node
// address per family, comma-separated.
func (tp *topo) startSpeaker(n, nexthop string, cfg bgp.Config) *speaker {
	tp.t.Helper()
	b, _ := json.Marshal(cfg)
	return tp.startHelper(n, "OHX_SPEAKER="+string(b), "OHX_NEXTHOP="+nexthop)
}

func (tp *topo) startResponder(n, iface string) *speaker {
	tp.t.Helper()
	return tp.startHelper(n, "OHX_L2="+iface)
}

// startHelper re-executes the test binary in namespace n as a helper.
func (tp *topo) startHelper(n string, env ...string) *speaker {
	tp.t.Helper()
	cmd := tp.command(n, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	s := &speaker{t: tp.t, cmd: cmd, in: in, out: bufio.NewScanner(out), stderr: &strings.Builder{}}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		tp.t.Fatal(err)
	}
	tp.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if tp.t.Failed() {
			tp.t.Logf("speaker %s log:\n%s", n, s.stderr)
		}
	})
	s.expectOK("start")
	return s
}

func (s *speaker) expectOK(what string) {
	s.t.Helper()
	if !s.out.Scan() {
		s.t.Fatalf("speaker %s: no answer\n%s", what, s.stderr)
	}
	if l := s.out.Text(); l != "ok" {
		s.t.Fatalf("speaker %s: %s", what, l)
	}
}

func (s *speaker) set(ips ...string) {
	s.t.Helper()
	fmt.Fprintf(s.in, "set %s\n", strings.Join(ips, ","))
	s.expectOK("set")
}

// kill ends the helper without any goodbye (a crashed agent).
func (s *speaker) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

func (s *speaker) stop() {
	s.t.Helper()
	fmt.Fprintln(s.in, "stop")
	s.expectOK("stop")
	_ = s.cmd.Wait()
}
