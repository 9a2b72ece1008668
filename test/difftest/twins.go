package difftest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/onehop/onehop/test/cluster"
	"github.com/onehop/onehop/test/netns"
	"github.com/onehop/onehop/test/nsutil"
)

// startTwins builds the kube-proxy twin and the onehop twin under dir.
func startTwins(ctx context.Context, dir string, log *slog.Logger) (*runner, error) {
	return startTwinsWith(ctx, dir, log, func(kp, agent string) [2]twinSpec {
		return [2]twinSpec{{"kube-proxy", kubeProxy{bin: kp}}, {"onehop", &onehopAgent{bin: agent}}}
	})
}

// startTwinsWith builds the twins proxies names, given kube-proxy's and
// the agent's binaries (ipvsmode.go's are those of the IPVS comparison).
func startTwinsWith(ctx context.Context, dir string, log *slog.Logger, proxies func(kubeProxyBin, agentBin string) [2]twinSpec) (*runner, error) {
	nsutil.Sweep(ctx, log)
	binDir, err := nodeBinaries(ctx)
	if err != nil {
		return nil, err
	}
	kp, err := kubeProxyBinary(binDir)
	if err != nil {
		return nil, err
	}
	agent, err := netns.AgentBinary(ctx, dir)
	if err != nil {
		return nil, err
	}
	return buildTwins(ctx, dir, binDir, proxies(kp, agent), log)
}

// twinSpec names a twin and the proxy it runs.
type twinSpec struct {
	name  string
	proxy proxy
}

// buildTwins builds the two twins at once, with one run ID: their
// namespaces differ by "-a" and "-b" after it.
func buildTwins(ctx context.Context, dir, binDir string, specs [2]twinSpec, log *slog.Logger) (*runner, error) {
	id := nsutil.RunID()
	r := &runner{log: log}
	var wg sync.WaitGroup
	var errs [2]error
	for i, s := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := filepath.Join(dir, fmt.Sprintf("%c-%s", 'a'+i, s.name))
			if err := os.MkdirAll(d, 0o755); err != nil {
				errs[i] = err
				return
			}
			r.twins[i], errs[i] = newTwin(ctx, s.name, fmt.Sprintf("%s-%c", id, 'a'+i), d, binDir, s.proxy, log)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// Close tears both twins down.
func (r *runner) Close() {
	for _, tw := range r.twins {
		if tw != nil {
			tw.Close()
		}
	}
}

// nodeBinaries returns $ONEHOP_CONTROLPLANE_BIN, or the directory of
// hack/controlplane.sh's node set (kube-apiserver, etcd and kube-proxy
// among them; built once per machine).
func nodeBinaries(ctx context.Context) (string, error) {
	if dir := os.Getenv(cluster.EnvBinDir); dir != "" {
		return dir, nil
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "controlplane.sh"), "node")
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hack/controlplane.sh node: %w", err)
	}
	return strings.TrimSpace(out.String()), nil
}
