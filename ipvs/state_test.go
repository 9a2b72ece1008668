package ipvs

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/portal"
)

// TestStateFileUnwritable: a state file that cannot be written (a
// read-only root filesystem) fails no sync; the names stay in memory, so a
// full sync still recognises and removes the NodePort virtual server of a
// deleted Service, and Dump still names Service ports.
func TestStateFileUnwritable(t *testing.T) {
	n := newTestNet(t, 1)
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	b := n.backend(testCfg, WithStateFile(filepath.Join(notDir, "state.json")),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	s := web(1)
	s.Portals[0].NodePort = 30083
	b.sync(true, s)
	b.sync(true, s, svc("other", func(p *portal.Portal) { p.ClusterIPs = addrs("10.96.0.11") }))
	if d := b.dump(); len(d.Ports) != 2 || d.Ports[1].Service != "test/web:http/tcp/ipv4" {
		t.Errorf("dump without a state file: %+v", d.Ports)
	}
	if got := strings.Count(logs.String(), "cannot write the state file"); got != 1 {
		t.Errorf("%d warnings about the state file, want 1:\n%s", got, logs.String())
	}
	b.sync(true) // every Service gone
	out, err := exec.Command("ip", "netns", "exec", n.node, "ipvsadm", "-Ln").CombinedOutput()
	if err != nil {
		t.Fatalf("ipvsadm: %v\n%s", err, out)
	}
	if strings.Contains(string(out), ":30083") || strings.Contains(string(out), vip) {
		t.Errorf("virtual servers left after a full sync without Services:\n%s", out)
	}
}
