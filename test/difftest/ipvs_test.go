package difftest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/test/nsutil"
)

// defaultIPVSCases is how many cases the IPVS comparison runs by default
// (from seed 1): the test VM emulates its CPU, so a case costs several
// times what it costs on the host.
const defaultIPVSCases = 10

// TestDifferentialIPVS gives kube-proxy's IPVS mode and onehop's IPVS
// dataplane the same random cases (ipvsmode.go) and fails on every
// difference that neither allowed.go nor ipvsDifferences lists. It needs
// IPVS, so it runs in the test VM: ONEHOP_VM_PACKAGES=./test/difftest:TestDifferentialIPVS
// go test ./test/vm/ (EnvCases and EnvSeed travel into the VM).
func TestDifferentialIPVS(t *testing.T) {
	if os.Getenv("ONEHOP_VM") == "" {
		t.Skip("needs IPVS: runs inside the test VM (test/vm)")
	}
	nsutil.RequireRoot(t)
	seed, cases := uint64(defaultSeed), defaultIPVSCases
	if os.Getenv(EnvCases) != "" || os.Getenv(EnvSeed) != "" {
		seed, cases = runSize(t)
	}
	t.Logf("difftest ipvs: %d cases from seed %d", cases, seed)

	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	began := time.Now()
	dir := t.TempDir()
	r, err := startIPVSTwins(ctx, dir, log)
	if err != nil {
		logProxyLogs(t, dir, true)
		t.Fatalf("twins: %v", err)
	}
	defer r.Close()
	t.Cleanup(func() {
		if t.Failed() {
			r.logState(t)
			logProxyLogs(t, dir, false)
			logKernel(t, r)
		}
	})
	up := time.Now()
	t.Logf("twins up in %v", up.Sub(began).Round(time.Millisecond))

	seen := map[string]int{}
	for i := range cases {
		c, steps, diffs, at, err := r.runCase(ctx, seed+uint64(i))
		if err != nil {
			t.Fatalf("case seed %d: %v\n%s", c.Seed, err, c.YAML())
		}
		for _, d := range diffs {
			if d.Allowed != nil {
				seen[d.Allowed.Name]++
			}
		}
		switch {
		case len(failing(diffs)) == 0:
		case at > 0:
			t.Errorf("case seed %d: kube-proxy and onehop (IPVS) differ after its changes\n%s%s", c.Seed, r.reportSteps(c, steps[:at], diffs), ipvsReplay(c.Seed))
		default:
			small, smallDiffs, err := r.shrink(ctx, c, diffs)
			if err != nil {
				t.Logf("shrinking case seed %d: %v", c.Seed, err)
			}
			t.Errorf("case seed %d: kube-proxy and onehop (IPVS) differ\n%s%s", c.Seed, r.report(small, smallDiffs), ipvsReplay(c.Seed))
		}
	}
	took := time.Since(up)
	t.Logf("difftest ipvs: %d cases from seed %d in %v (%.1f cases/minute; twins up in %v); allowed differences seen: %v",
		cases, seed, took.Round(time.Second), float64(cases)/took.Minutes(), up.Sub(began).Round(time.Second), seen)
}

// logProxyLogs logs, for every proxy log under dir, its last errors,
// warnings and syncs, each cut short (kube-proxy's errors carry whole
// rulesets), and with tail its end: the guest's files go with it.
func logProxyLogs(t *testing.T, dir string, tail bool) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*", "*-node-*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		var errs []string
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "E") || strings.HasPrefix(line, "W") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") ||
				strings.Contains(line, "SyncProxyRules complete") {
				errs = append(errs, line[:min(len(line), 700)])
			}
		}
		t.Logf("=== %s: %d errors, warnings and syncs, the last:\n%s", filepath.Base(l), len(errs), strings.Join(errs[max(0, len(errs)-12):], "\n"))
		if tail {
			t.Logf("=== %s (tail):\n%s", filepath.Base(l), b[max(0, len(b)-4000):])
		}
	}
}

// ipvsReplay is the command that replays case seed in the VM.
func ipvsReplay(seed uint64) string {
	return fmt.Sprintf("# replay (IPVS, in the VM): ONEHOP_VM_PACKAGES=./test/difftest:TestDifferentialIPVS %s=%d %s=1 go test -run TestIPVSInVM ./test/vm/\n",
		EnvSeed, seed, EnvCases)
}

// logKernel logs what each node's kernel holds for the Services: IPVS
// virtual servers and the dummy interface's addresses.
func logKernel(t *testing.T, r *runner) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tw := range r.twins {
		for _, n := range tw.Nodes {
			var b strings.Builder
			for _, argv := range [][]string{{"ipvsadm", "-Ln"}, {"ip", "addr", "show", "type", "dummy"}} {
				out, err := nsutil.Exec(ctx, n.Netns, argv...)
				fmt.Fprintf(&b, "$ %s (%v)\n%s\n", strings.Join(argv, " "), err, out[:min(len(out), 3000)])
			}
			t.Logf("=== %s on %s, kernel:\n%s", tw.Name, n.Name, b.String())
		}
	}
}
