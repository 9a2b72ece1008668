package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/onehop/onehop/test/nsutil"
)

// testNetns is a throwaway network namespace from test/nsutil, deleted
// with what runs in it when the test ends.
type testNetns struct {
	*nsutil.NS
	handle netns.NsHandle
}

// newTestNetns creates a uniquely named network namespace, or skips the
// test when this machine cannot (not root, no ip binary).
func newTestNetns(t *testing.T, prefix string) *testNetns {
	t.Helper()
	n := nsutil.New(t, prefix)
	return &testNetns{NS: n, handle: netns.NsHandle(n.FD())}
}

// exec runs a command in the namespace with stdin, failing the test on error.
func (n *testNetns) exec(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	cmd := n.Command(args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// onehopNFT stands for onehop's live table.
const onehopNFT = `table inet onehop {
	chain prerouting { type nat hook prerouting priority dstnat; policy accept; }
}
`

// `agent cleanup --kube-proxy-leftovers`, as the migration guide runs it on
// a node onehop serves, removes kube-proxy's tables and chains and leaves
// onehop's table alone; plain `agent cleanup` then removes onehop's table
// only. On this kernel (no IPVS) neither says a word about IPVS.
func TestCleanupCommands(t *testing.T) {
	for _, bin := range []string{"nft", "iptables-nft-restore", "iptables-nft-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s (Debian: nftables, iptables): %v", bin, err)
		}
	}
	ns := newTestNetns(t, "ohcl-")
	ns.exec(t, kubeProxyRuleset, "iptables-nft-restore")
	ns.exec(t, kubeProxyNFT+onehopNFT, "nft", "-f", "-")

	run := func(args ...string) (string, string, error) {
		var stdout, stderr bytes.Buffer
		var err error
		inNetns(t, ns, func() { err = cleanupCmd(context.Background(), args, &stdout, &stderr) })
		t.Logf("agent cleanup %s:\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), stdout.String(), stderr.String())
		return stdout.String(), stderr.String(), err
	}

	stdout, stderr, err := run("--kube-proxy-leftovers")
	if err != nil {
		t.Fatalf("cleanup --kube-proxy-leftovers: %v", err)
	}
	tables := ns.exec(t, "", "nft", "list", "tables")
	if !strings.Contains(tables, "table inet onehop") {
		t.Errorf("--kube-proxy-leftovers removed onehop's live table; tables now:\n%s", tables)
	}
	if strings.Contains(tables, "kube-proxy") || !strings.Contains(tables, "table inet someone-else") {
		t.Errorf("tables after --kube-proxy-leftovers:\n%s", tables)
	}
	if strings.Contains(stdout, "onehop") || !strings.Contains(stdout, "nftables table ip kube-proxy") {
		t.Errorf("--kube-proxy-leftovers output:\n%s", stdout)
	}
	if strings.Contains(strings.ToLower(stderr), "ipvs") {
		t.Errorf("--kube-proxy-leftovers talks about IPVS:\n%s", stderr)
	}
	if saved := ns.exec(t, "", "iptables-nft-save"); strings.Contains(saved, "KUBE-SERVICES") {
		t.Errorf("kube-proxy's iptables chains left:\n%s", saved)
	}

	stdout, stderr, err = run()
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	tables = ns.exec(t, "", "nft", "list", "tables")
	if strings.Contains(tables, "onehop") || !strings.Contains(tables, "table inet someone-else") {
		t.Errorf("tables after cleanup:\n%s", tables)
	}
	if !strings.Contains(stdout, "removed onehop's nft state") {
		t.Errorf("cleanup output:\n%s", stdout)
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil && stderr != "" {
		t.Errorf("cleanup on a kernel without IPVS wrote to stderr:\n%s", stderr)
	}
	if strings.Contains(stdout, "ipvs") && !ipvsLoaded() {
		t.Errorf("cleanup reports IPVS work on a kernel without IPVS:\n%s", stdout)
	}

	// Again: nothing left, still quiet.
	if _, stderr, err = run(); err != nil || stderr != "" {
		t.Errorf("second cleanup: err %v, stderr %q", err, stderr)
	}
}
