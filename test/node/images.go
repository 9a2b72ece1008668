package node

import (
	"context"
	"fmt"
	"path/filepath"
)

// AgnhostImage is the e2e suite's test image, under the name e2e.test asks
// for (k8s.io/kubernetes/test/utils/image), so that no pull is needed.
const AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"

// agnhostPrograms are what the e2e suite and the tests run inside agnhost
// pods besides agnhost itself (curl, nc, nslookup, a shell); the upstream
// image has them from Alpine, this one from the machine's Debian packages.
var agnhostPrograms = []string{
	"sh", "bash", "curl", "nc", "nslookup", "dig", "wget", "ip", "hostname",
	"timeout", "sleep", "seq", "cat", "ls", "echo", "printf", "test", "date", "env", "id",
	"grep", "sed", "awk", "head", "tail", "tr", "wc", "sort", "uniq", "cut", "xargs", "mkdir", "rm", "touch", "ps",
	"dd", "cp", "mv", "chmod", "stat", "uname",
}

// BuildAgnhostImage writes the agnhost image (agnhost from bin, see
// Binaries) to path.
func BuildAgnhostImage(bin, path string) error {
	spec := ImageSpec{
		Ref:        AgnhostImage,
		Files:      map[string]string{"/agnhost": filepath.Join(bin, "agnhost")},
		Links:      map[string]string{"/agnhost-2": "agnhost"},
		Dirs:       []string{"/tmp", "/uploads", "/etc", "/var/run"},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
	}
	if err := WithHostPrograms(&spec, agnhostPrograms...); err != nil {
		return err
	}
	return WriteImage(spec, path)
}

// BuildAgentImage builds the agent (as `make build` does) and writes the
// image the Dockerfile's default target makes, /usr/local/bin/agent alone
// (FROM scratch), as ref to path.
func BuildAgentImage(ctx context.Context, ref, path string) error {
	bin, err := agentBinary(ctx, path)
	if err != nil {
		return err
	}
	return WriteImage(ImageSpec{
		Ref:        ref,
		Files:      map[string]string{"/usr/local/bin/agent": bin},
		Entrypoint: []string{"/usr/local/bin/agent"},
	}, path)
}

// iptablesPrograms are the iptables commands, both variants: the images
// that run iptables (kube-proxy's, onehop's IPVS one) carry them.
var iptablesPrograms = []string{
	"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore",
	"iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore",
	"iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore", "ip6tables-legacy", "ip6tables-legacy-save", "ip6tables-legacy-restore",
}

// withIptables adds the iptables commands and their extension modules.
func withIptables(spec *ImageSpec) error {
	if err := WithHostPrograms(spec, iptablesPrograms...); err != nil {
		return err
	}
	const xtables = "/usr/lib/x86_64-linux-gnu/xtables"
	mods, err := filepath.Glob(filepath.Join(xtables, "*.so"))
	if err != nil || len(mods) == 0 {
		return fmt.Errorf("image %s: no iptables extensions in %s (%v)", spec.Ref, xtables, err)
	}
	for _, m := range mods {
		spec.Files[m] = m
	}
	return nil
}

// KubeProxyImage is the kube-proxy image testdata/kube-proxy.yaml runs.
const KubeProxyImage = "onehop.test/kube-proxy:v1.37.2"

// BuildKubeProxyImage writes kube-proxy's image (from bin, with nft and
// iptables from the machine's Debian packages) to path.
func BuildKubeProxyImage(bin, path string) error {
	spec := ImageSpec{
		Ref:        KubeProxyImage,
		Files:      map[string]string{"/usr/local/bin/kube-proxy": filepath.Join(bin, "kube-proxy")},
		Dirs:       []string{"/tmp", "/etc", "/run", "/var/run"},
		Entrypoint: []string{"/usr/local/bin/kube-proxy"},
	}
	if err := WithHostPrograms(&spec, "nft", "sh"); err != nil {
		return err
	}
	if err := withIptables(&spec); err != nil {
		return err
	}
	return WriteImage(spec, path)
}

// BuildAgentIPVSImage writes the image the Dockerfile's ipvs target makes:
// the agent with iptables.
func BuildAgentIPVSImage(ctx context.Context, ref, path string) error {
	bin, err := agentBinary(ctx, path)
	if err != nil {
		return err
	}
	spec := ImageSpec{
		Ref:        ref,
		Files:      map[string]string{"/usr/local/bin/agent": bin},
		Dirs:       []string{"/tmp", "/etc", "/run"},
		Entrypoint: []string{"/usr/local/bin/agent"},
	}
	if err := withIptables(&spec); err != nil {
		return err
	}
	return WriteImage(spec, path)
}

// CoreDNSImage is the cluster DNS image testdata/coredns.yaml runs.
const CoreDNSImage = "onehop.test/coredns:test"

// BuildCoreDNSImage writes the CoreDNS image (test/tools/coredns, from bin)
// to path.
func BuildCoreDNSImage(bin, path string) error {
	return WriteImage(ImageSpec{
		Ref:        CoreDNSImage,
		Files:      map[string]string{"/coredns": filepath.Join(bin, "coredns")},
		Dirs:       []string{"/tmp", "/etc"},
		Entrypoint: []string{"/coredns"},
	}, path)
}

// agentBinary builds the agent as `make build` does, next to the image
// tarball path, and returns its path.
func agentBinary(ctx context.Context, path string) (string, error) {
	bin := path + ".agent"
	return bin, GoBuild(ctx, bin, "./cmd/agent", "-tags", "grpcnotrace", "-ldflags", "-s -w")
}
