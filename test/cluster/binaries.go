package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// EnvBinDir names the environment variable that points at a directory with
// prebuilt kube-apiserver, etcd and kubectl, skipping hack/controlplane.sh.
const EnvBinDir = "ONEHOP_CONTROLPLANE_BIN"

// Binaries returns the directory holding kube-apiserver, etcd and kubectl:
// $ONEHOP_CONTROLPLANE_BIN when set, otherwise what hack/controlplane.sh
// prints (it builds them on the first call on a machine, which takes many
// minutes, and costs nothing afterwards). Build progress goes to stderr.
func Binaries(ctx context.Context) (string, error) {
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "controlplane.sh"))
		cmd.Stdout = &out
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("hack/controlplane.sh: %w", err)
		}
		dir = strings.TrimSpace(out.String())
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("control-plane binaries in %q: %w", dir, err)
		}
	}
	return dir, nil
}

// RepoRoot finds the onehop checkout from the working directory upwards (go
// test runs in the package directory; the demo in the repository root).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "controlplane.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the onehop repository (hack/controlplane.sh) above the working directory")
		}
		dir = parent
	}
}
