package vm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// guestMemoryMB is the guest's memory when no selected package asks for
// more: enough for the kernel-facing tests, small enough to boot fast.
const guestMemoryMB = 1024

// guestNeed is what a guest package needs beyond its test binary and the
// base image's tools: host files packed into the initramfs, environment
// for the guest's test binaries, and memory. Only a run that selects the
// package pays for them.
type guestNeed struct {
	// files returns the host files to pack, by absolute guest path; work
	// is a scratch directory of this run.
	files    func(ctx context.Context, root, work string) (map[string]string, error)
	env      []string // K=V; no spaces or commas (the kernel command line carries them)
	modules  []string // to load beyond the base image's (image.sh's optmods)
	memoryMB int
	timeout  time.Duration // how long the whole run may take, if over 15 minutes
}

// guestBinDir is where a guest package's extra binaries are in the guest.
const guestBinDir = "/opt/onehop/bin"

// guestNeeds are keyed by package as in GuestPackages (without ":regexp").
//
// The differential tester's IPVS comparison runs two twin clusters in the
// guest: each with its own etcd and kube-apiserver, one running kube-proxy
// in IPVS mode, the other the agent with its IPVS dataplane. It finds the
// binaries where the host tests look for them: $ONEHOP_CONTROLPLANE_BIN
// (cluster.EnvBinDir) and $ONEHOP_AGENT (netns.EnvAgent).
var guestNeeds = map[string]guestNeed{
	"./test/difftest": {
		files: difftestFiles,
		env: []string{
			"ONEHOP_CONTROLPLANE_BIN=" + guestBinDir,
			"ONEHOP_AGENT=" + guestBinDir + "/agent",
		},
		// The twins' pods share a bridge per node, and Service traffic
		// between two pods of a node needs bridged packets to pass
		// netfilter (br_netfilter), as on the host.
		// The agent's netlink handle opens an XFRM socket too, which a
		// kernel without xfrm_user refuses.
		// kube-proxy's IPVS mode matches on bridge ports (xt_physdev) for
		// externalIPs of Local policy.
		modules: []string{"bridge", "br_netfilter", "xt_physdev", "xfrm_user"},
		// Two API servers, two etcds, four proxies and the probes, with
		// some 450 MB of binaries in the initramfs (kept in memory).
		memoryMB: 4096,
		// The API servers alone take 1 to 7 minutes to be ready under
		// emulation, each case minutes more (docs/difftest.md, IPVS);
		// go test's -timeout still bounds it.
		timeout: 2 * time.Hour,
	},
}

// difftestFiles returns etcd, kube-apiserver and kube-proxy (from
// $ONEHOP_CONTROLPLANE_BIN when it has kube-proxy, otherwise from
// hack/controlplane.sh's node set, built once per machine) and an agent
// built as `make build` ships it (static, no cgo).
func difftestFiles(ctx context.Context, root, work string) (map[string]string, error) {
	dir := os.Getenv("ONEHOP_CONTROLPLANE_BIN")
	if _, err := os.Stat(filepath.Join(dir, "kube-proxy")); dir == "" || err != nil {
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "controlplane.sh"), "node")
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("hack/controlplane.sh node: %w", err)
		}
		dir = strings.TrimSpace(out.String())
	}
	files := map[string]string{}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-proxy"} {
		p := filepath.Join(dir, b)
		if _, err := os.Stat(p); err != nil {
			return nil, err
		}
		files[guestBinDir+"/"+b] = p
	}
	agent := filepath.Join(work, "agent")
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "build", "BIN="+agent)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make build: %v\n%s", err, b)
	}
	files[guestBinDir+"/agent"] = agent
	// The guest's / stands for the repository: cluster.RepoRoot finds
	// hack/controlplane.sh above the tests' working directory (/tmp), and
	// the onehop twin's RBAC is read from deploy/base there.
	files["/hack/controlplane.sh"] = filepath.Join(root, "hack", "controlplane.sh")
	err := filepath.WalkDir(filepath.Join(root, "deploy", "base"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(root, p)
			files["/"+filepath.ToSlash(rel)] = p
		}
		return err
	})
	return files, err
}
