// Package deploy_test validates the manifests in deploy/ with a server-side
// dry run against a real kube-apiserver.
package deploy_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/nsutil"
)

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s", file)
	}
	return root
}

// kubectl apply -k deploy/ (and the ipvs overlay) is accepted by a real
// apiserver with strict field validation; a manifest with an unknown field
// is not, so the check can fail.
func TestManifestsServerSideDryRun(t *testing.T) {
	if err := nsutil.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	name := nsutil.RunID() + "-dep"
	if err := nsutil.Create(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsutil.Delete(context.Background(), name) })
	const addr = "192.0.2.3"
	if err := nsutil.IP(ctx, name, "addr", "add", addr+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	cp, err := cluster.Start(ctx, cluster.Options{Netns: name, Address: addr, Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	bin, err := cluster.Binaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) (string, error) {
		return nsutil.Exec(ctx, name, append([]string{filepath.Join(bin, "kubectl"), "--kubeconfig", cp.Kubeconfig}, args...)...)
	}
	root := repoRoot(t)
	for _, dir := range []string{"deploy", "deploy/ipvs"} {
		out, err := kubectl("apply", "-k", filepath.Join(root, dir), "--dry-run=server", "--validate=strict")
		if err != nil {
			t.Errorf("kubectl apply -k %s --dry-run=server: %v\n%s", dir, err, out)
			continue
		}
		t.Logf("%s:\n%s", dir, out)
		if !strings.Contains(out, "daemonset.apps/") {
			t.Errorf("%s: no DaemonSet in the dry run:\n%s", dir, out)
		}
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: kube-system\ndata: {}\nnonsense: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-f", bad, "--dry-run=server", "--validate=strict"); err == nil {
		t.Errorf("a manifest with an unknown field passed the dry run:\n%s", out)
	}
}
